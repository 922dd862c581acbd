"""The reaper: reclaim running jobs whose worker stopped heartbeating.

Behaviour: every pass takes stale rows in batches with ``FOR UPDATE SKIP
LOCKED`` and bumps their lease, so reapers on many hosts split the work and
never reclaim one row twice, and the lost worker's late writes are fenced.
Reclaimed jobs go back to ``pending`` (run at once) or to ``dead`` when they had
no attempts left, with a "worker lost" entry in their error history. ``Worker``
rows not refreshed within ``STALE_AFTER`` are deleted too.

Settings: ``STALE_AFTER`` (default 30 s), ``REAPER_INTERVAL`` (10 s).
Signal: ``jobs_reaped(jobs=[(id, task, status)], worker=...)``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

from django_pgjobs import signals
from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import job_reap_stale, worker_forget_stale

logger = logging.getLogger("django_pgjobs")


class Reaper:
    """Maintenance service, and ``reap_jobs``: reclaim running jobs whose heartbeat is
    older than ``stale_after``, and forget worker rows silent for twice that."""

    name = "reaper"

    def __init__(
        self,
        *,
        alias: str | None = None,
        stale_after: float | None = None,
        batch: int = 500,
        worker: str | None = None,
    ):
        conf = get_settings()
        self.alias = alias or conf.DATABASE
        self.stale_after = conf.STALE_AFTER if stale_after is None else stale_after
        self.interval = conf.REAPER_INTERVAL
        self.batch = batch
        self.worker = worker

    def run_once(self) -> dict[str, Any]:
        """Reclaim every stale job now; returns counts per new status."""
        connection = connections[self.alias]
        reaped: list[tuple[int, str, str]] = []
        while True:
            rows = job_reap_stale(connection, stale_after=self.stale_after, batch=self.batch)
            for job_id, task, status, attempts, lost_worker in rows:
                logger.warning(
                    "reaped job %s (%s, attempt %s) from worker %s: heartbeat older than %gs -> %s",
                    job_id,
                    task,
                    attempts,
                    lost_worker,
                    self.stale_after,
                    status,
                    extra={
                        "job_id": job_id,
                        "task": task,
                        "attempt": attempts,
                        "worker": lost_worker,
                    },
                )
                reaped.append((job_id, task, status))
            if len(rows) < self.batch:
                break
        # A worker that stopped heartbeating is as lost as its jobs: drop its row so
        # the admin and jobs_status stop counting it (a live one re-inserts it). After
        # 2 x STALE_AFTER, not STALE_AFTER: its held limit slots wait that long for it
        # (db/held_slots.py forget_gone), and a missing row would let them go at once.
        with connection.cursor() as cursor:
            worker_forget_stale(cursor, older_than=2 * self.stale_after)
        if reaped:
            signals.send(signals.jobs_reaped, jobs=reaped, worker=self.worker)
        counts: dict[str, Any] = {"reaped": len(reaped)}
        for _, _, status in reaped:
            counts[status] = counts.get(status, 0) + 1
        return counts
