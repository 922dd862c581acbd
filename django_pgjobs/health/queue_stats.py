"""The thread that reads the queue gauges on an interval, never per scrape.

It runs ``overview.queue_rows`` — the same exact, index-backed query as
``jobs_status`` and the admin overview (pending rows through the claim index,
running rows through the running index; never the history) — on its own
database connection, and hands the result to the metrics' ``QueueCollector``.
A database error keeps the last snapshot and is retried at the next interval.
Each read also lists the queue table's rows: those queues, the configured ones and
the worker's own keep their metrics label; every other queue is folded into
``queue="other"``, so a flood of ad-hoc queue names cannot grow ``/metrics``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections

from django_pgjobs.conf import METRICS_INTERVAL, get_settings
from django_pgjobs.db.reports import QUEUE_NAMES
from django_pgjobs.health import overview
from django_pgjobs.queues import declared_queues

logger = logging.getLogger("django_pgjobs")


@dataclass
class QueueSample(overview.QueueCounts):
    """One queue's live work as the refresher last read it: the counts every status
    page shares, and the lag in seconds (a gauge has no "none": 0 when nothing is due)."""

    lag: float = 0.0  # seconds since the oldest due job's run_at
    # fair shares: the longest a fair key with a due job and none running has waited
    fair_wait: float = 0.0


def configured_queues(served: Sequence[str] | None) -> set[str]:
    """The queues the code and settings name, and those this worker serves: each keeps
    its own metrics label (with the queue table's rows, read by the refresher)."""
    return declared_queues() | set(served or ())


class QueueStatsRefresher(threading.Thread):
    """Daemon thread: ``target.update(samples)`` every ``interval`` seconds (default:
    ``PGJOBS_METRICS_INTERVAL``, 10 s; a Prometheus scrape interval is usually 15-60 s,
    and reading more often would only cost the database)."""

    def __init__(
        self,
        target: Any,
        *,
        queues: Sequence[str] | None = None,
        alias: str | None = None,
        interval: float | None = None,
    ) -> None:
        super().__init__(name="pgjobs-metrics", daemon=True)
        conf = get_settings()
        self.target = target
        self.known = list(queues or [])
        self.alias = alias or conf.DATABASE
        self.stale_after = conf.STALE_AFTER
        self.interval = METRICS_INTERVAL.value() if interval is None else interval
        self.refreshed = threading.Event()  # set after each successful read (tests wait on it)
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def run(self) -> None:
        try:
            while True:
                self.refresh_once()
                if self._stop_event.wait(self.interval):
                    return
        finally:
            connections[self.alias].close()

    def refresh_once(self) -> bool:
        """One read; False (and the last snapshot kept) when the database failed."""
        connection = connections[self.alias]
        try:
            rows = overview.queue_rows(connection, stale_after=self.stale_after)
            fair = overview.fair_waits(connection)
            with connection.cursor() as cursor:
                cursor.execute(QUEUE_NAMES)
                kept = configured_queues(self.known) | {str(n) for (n,) in cursor.fetchall()}
        except DatabaseError as exc:
            logger.warning("metrics: could not read queue stats (keeping the last ones): %s", exc)
            connection.close()
            return False
        samples = [
            QueueSample(
                r.queue,
                r.pending,
                r.due,
                r.running,
                r.stuck,
                blocked=r.blocked,
                waiting=r.waiting,
                lag=r.lag_seconds,
                fair_wait=fair.get(r.queue, 0.0),
            )
            for r in rows.values()
        ]
        self.target.update(samples, known=self.known, kept=kept)
        self.refreshed.set()
        return True
