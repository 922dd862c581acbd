"""The last hour, minute by minute: what the overview's charts draw.

Two read-only queries (``db/reports.py``), each bounded like the rest of the overview — they read
the minute rollup (``db/rollup.py``), the few seconds of finishes since its mark and the
running jobs, so their cost follows neither the throughput nor the history:

* finished jobs per minute and final status: the rollup's minutes plus the live tail;
* queue lag per minute, reconstructed from the rows themselves. A job waited
  from its ``run_at`` until its ``started_at``; the lag of a queue at minute *t*
  is the longest such wait still open at *t*. For every minute in which jobs
  were claimed, the query returns the earliest ``run_at`` among them (the rollup's
  ``waited_since`` of that minute, rows finished since its mark, and running rows,
  through the running index); the still-waiting jobs add the current lag (the
  status query's oldest due ``run_at``, through the claim index). From these,
  lag(t) = t - min{earliest run_at of jobs claimed after t that were due by t}.
  An attempt that failed and is waiting for its retry keeps only its latest
  ``run_at``, so the wait before an earlier attempt is not drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.db.reports import CLAIMED_PER_MINUTE, FINISHED_PER_MINUTE
from django_pgjobs.states import JobStatus

#: How far back the charts go.
WINDOW = timedelta(hours=1)
#: At most this many queues get a lag line (the ones that lagged most).
MAX_LAG_QUEUES = 6
#: Final statuses drawn, in stacking order.
OUTCOMES = (JobStatus.COMPLETED.value, JobStatus.DEAD.value, JobStatus.CANCELLED.value)


@dataclass
class Activity:
    """The charts' data: ``minutes`` are the window's minute starts, oldest first,
    then the current (partial) minute."""

    now: datetime
    minutes: list[datetime]
    finished: dict[str, list[int]]  # outcome -> count per minute
    lag: dict[str, list[float]] = field(default_factory=dict)  # queue -> seconds per minute

    @property
    def finished_total(self) -> dict[str, int]:
        return {outcome: sum(counts) for outcome, counts in self.finished.items()}


def _minutes(now: datetime, window: timedelta) -> list[datetime]:
    current = now.replace(second=0, microsecond=0)
    n = int(window.total_seconds() // 60)
    return [current - timedelta(minutes=n - i) for i in range(n + 1)]


def activity(
    connection: BaseDatabaseWrapper,
    *,
    now: datetime,
    oldest_due: dict[str, datetime],
    window: timedelta = WINDOW,
) -> Activity:
    """Two queries. ``now``: the database clock; ``oldest_due``: per queue, the run_at
    of the oldest due pending job (from the status query, already run by the page)."""
    minutes = _minutes(now, window)
    index = {m: i for i, m in enumerate(minutes)}
    finished = {outcome: [0] * len(minutes) for outcome in OUTCOMES}
    params = {"window": window.total_seconds()}
    with connection.cursor() as cursor:
        cursor.execute(FINISHED_PER_MINUTE, params)
        for minute, status, count in cursor.fetchall():
            if minute in index and status in finished:
                finished[status][index[minute]] += count
        cursor.execute(CLAIMED_PER_MINUTE, params)
        claimed: dict[str, list[tuple[datetime, datetime]]] = {}
        for queue, minute, earliest in cursor.fetchall():
            claimed.setdefault(queue, []).append((minute, earliest))
    lag: dict[str, list[float]] = {}
    for queue in set(claimed) | set(oldest_due):
        lag[queue] = _lag_line(minutes, now, claimed.get(queue, []), oldest_due.get(queue))
    top = sorted(lag, key=lambda q: (-max(lag[q]), q))[:MAX_LAG_QUEUES]
    return Activity(
        now=now, minutes=minutes, finished=finished, lag={q: lag[q] for q in sorted(top)}
    )


def _lag_line(
    minutes: list[datetime],
    now: datetime,
    claimed: list[tuple[datetime, datetime]],
    oldest_due: datetime | None,
) -> list[float]:
    """lag(t) for each minute start t (and ``now`` for the last, partial, minute)."""
    claimed = sorted(claimed)
    out: list[float] = []
    for i, minute in enumerate(minutes):
        t = now if i == len(minutes) - 1 else minute
        earliest = oldest_due if oldest_due is not None and oldest_due <= t else None
        if i < len(minutes) - 1:  # claims after t (none after now)
            for started_minute, run_at in claimed:
                if started_minute >= t and run_at <= t and (earliest is None or run_at < earliest):
                    earliest = run_at
        out.append(max(0.0, (t - earliest).total_seconds()) if earliest is not None else 0.0)
    return out
