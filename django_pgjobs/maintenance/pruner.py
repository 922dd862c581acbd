"""The pruner: delete finished jobs older than their retention, in small batches.

Behaviour: for each finished status with a retention (``PGJOBS["RETENTION"]``,
seconds per status; ``None`` keeps that status forever) it deletes the oldest
rows in batches of ``batch`` (default 1000). Every batch is one short statement
in its own transaction taken with ``FOR UPDATE SKIP LOCKED``, so pruners on many
hosts share the work, never wait on each other or on an admin action, and no
lock is held for longer than one batch. Results go with their job, except
results whose idempotency key must keep protecting against a re-run (see
``db/prune.py``); a job's signals go with it (the foreign key cascades). Events
(``emit_event``) are pruned by age, after ``PGJOBS["EVENT_RETENTION"]``, in the
same batches, once the jobs are done.

Inside ``runjobs`` a pass stops after ``time_budget`` seconds (the maintenance
thread also runs the reaper and the cron ticker) and resumes at the next
``PRUNER_INTERVAL``; ``manage.py prune_jobs`` runs to the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import (
    event_prune_batch,
    event_prune_count,
    job_prune_batch,
    job_prune_count,
)
from django_pgjobs.states import FINISHED, TERMINAL

logger = logging.getLogger("django_pgjobs")


class Pruner:
    """Maintenance service, and ``prune_jobs``: delete finished jobs older than their
    retention, batch by batch (see the module docstring)."""

    name = "pruner"

    def __init__(
        self,
        *,
        alias: str | None = None,
        retention: dict[str, float | None] | None = None,
        batch: int = 1000,
        time_budget: float | None = None,
        pause: float = 0.0,
        events: bool = True,
    ):
        conf = get_settings()
        #: Events older than this are deleted (None: a pass leaves them).
        self.event_retention: float | None = conf.EVENT_RETENTION if events else None
        self.alias = alias or conf.DATABASE
        self.retention: dict[str, float | None] = dict(
            conf.RETENTION if retention is None else retention
        )
        for status in self.retention:
            if status not in TERMINAL:
                raise ValueError(
                    f"retention names {status!r}, which is not a finished status "
                    f"({', '.join(FINISHED)})"
                )
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self.batch = batch
        self.time_budget = time_budget
        self.pause = pause
        self.interval = conf.PRUNER_INTERVAL

    def plan(self, statuses: Iterable[str] | None = None) -> list[tuple[str, float]]:
        """``(status, older_than seconds)`` for each status that has a retention."""
        wanted = FINISHED if statuses is None else tuple(statuses)
        return [(s, r) for s in wanted if (r := self.retention.get(s)) is not None]

    def count(self, statuses: Iterable[str] | None = None) -> dict[str, int]:
        """How many rows a pass would delete now, per status (for ``--dry-run``)."""
        out: dict[str, int] = {}
        with connections[self.alias].cursor() as cursor:
            for status, older_than in self.plan(statuses):
                out[status] = job_prune_count(cursor, status=status, older_than=older_than)
        return out

    def count_events(self) -> int:
        """How many events a pass would delete now (for ``--dry-run``)."""
        if self.event_retention is None:
            return 0
        with connections[self.alias].cursor() as cursor:
            return event_prune_count(cursor, older_than=self.event_retention)

    def run_once(self, statuses: Iterable[str] | None = None) -> dict[str, Any]:
        """Delete due rows batch by batch; returns counts per status and batch sizes."""
        started = time.monotonic()
        deleted: dict[str, int] = {}
        batches: list[int] = []
        complete = True
        connection = connections[self.alias]
        for status, older_than in self.plan(statuses):
            deleted[status] = 0
            while True:
                if self.time_budget is not None and time.monotonic() - started > self.time_budget:
                    complete = False
                    break
                with connection.cursor() as cursor:
                    n = job_prune_batch(
                        cursor, status=status, older_than=older_than, batch=self.batch
                    )
                if n:
                    batches.append(n)
                    deleted[status] += n
                if n < self.batch:
                    break
                if self.pause:
                    time.sleep(self.pause)
            if not complete:
                break
        events = 0
        if complete and statuses is None and self.event_retention is not None:
            events, complete = self._prune_events(started)
        total = sum(deleted.values())
        if total:
            logger.info(
                "pruned %d finished job(s) in %d batch(es): %s%s",
                total,
                len(batches),
                deleted,
                "" if complete else " (time budget reached; continuing next pass)",
            )
        if events:
            logger.info("pruned %d event(s) older than %gs", events, self.event_retention)
        return {
            "deleted": total,
            "by_status": deleted,
            "batches": batches,
            "complete": complete,
            "events": events,
        }

    def _prune_events(self, started: float) -> tuple[int, bool]:
        """Events past their retention, batch by batch within the pass's budget:
        (how many went, whether none is left due)."""
        deleted = 0
        connection = connections[self.alias]
        while True:
            if self.time_budget is not None and time.monotonic() - started > self.time_budget:
                return deleted, False
            with connection.cursor() as cursor:
                n = event_prune_batch(cursor, older_than=self.event_retention, batch=self.batch)
            deleted += n
            if n < self.batch:
                return deleted, True
            if self.pause:
                time.sleep(self.pause)
