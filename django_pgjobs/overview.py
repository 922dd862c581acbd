"""Read-only queries that describe the queue: what the admin overview shows.

Each function runs **one** query whose cost depends on the live work (pending and
running rows), on a recent time window, or on PostgreSQL's statistics — never on
the size of the job history. So the overview answers in a constant number of
queries, in milliseconds, with millions of finished rows in the table. The
``jobs_status`` command can reuse these functions.

What each number means (also in ``docs/howto/operate-the-queue.md``):

* pending / due / running / stuck: exact counts (partial indexes hold only live rows);
* lag: age of the oldest *due* pending job per queue (0 when nothing is due);
* completed / dead / cancelled per queue: exact counts of jobs that *finished in
  the last hour* (``RECENT_WINDOW``), read through the ``finished_at`` index;
* table-wide per-status totals: PostgreSQL's estimate from ``pg_stats`` (as fresh
  as the last ANALYZE), never a ``count(*)`` over the history;
* throughput: jobs completed in the last 5 and 60 minutes;
* dead-lettered in the last 24 hours: an exact count over the ``finished_at`` index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from .sql import JOB, WORKER
from .states import JobStatus

#: The window of the per-queue counts of finished jobs.
RECENT_WINDOW = timedelta(hours=1)
#: The window of the "dead-lettered recently" count.
DEAD_WINDOW = timedelta(hours=24)

FINISHED_STATUSES = (JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED)


@dataclass
class QueueRow:
    """One queue's line of the overview."""

    queue: str
    pending: int = 0
    due: int = 0
    running: int = 0
    stuck: int = 0
    lag: timedelta | None = None
    finished: dict[str, int] = field(default_factory=dict)  # status -> count in RECENT_WINDOW

    @property
    def lag_seconds(self) -> float:
        return self.lag.total_seconds() if self.lag else 0.0


@dataclass
class WorkerRow:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen: datetime
    last_seen_age: timedelta

    def is_live(self, stale_after: float) -> bool:
        return self.last_seen_age.total_seconds() <= stale_after


@dataclass
class TableHealth:
    """``pg_class`` / ``pg_stat_user_tables`` figures for the jobs table."""

    estimated_rows: int | None  # None: never analyzed yet
    status_estimates: dict[str, int]
    live_tuples: int
    dead_tuples: int
    total_bytes: int
    last_autovacuum: datetime | None
    last_vacuum: datetime | None
    last_autoanalyze: datetime | None
    autovacuum_count: int

    @property
    def dead_ratio(self) -> float:
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else 0.0


@dataclass
class Overview:
    now: datetime
    queues: list[QueueRow]
    stuck: int
    dead_recent: int
    completed_5m: int
    completed_60m: int
    workers: list[WorkerRow]
    health: TableHealth
    stale_after: float = 30.0

    @property
    def live_workers(self) -> list[WorkerRow]:
        return [w for w in self.workers if w.is_live(self.stale_after)]


# One scan of the pending rows (the claim index's rows), grouped by queue.
PENDING_BY_QUEUE = f"""
SELECT queue, count(*), count(*) FILTER (WHERE run_at <= now()),
       now() - min(run_at) FILTER (WHERE run_at <= now())
  FROM {JOB} WHERE status = '{JobStatus.PENDING}'
 GROUP BY queue
"""

# One scan of the running rows (the reaper's partial index), grouped by queue.
RUNNING_BY_QUEUE = f"""
SELECT queue, count(*),
       count(*) FILTER (WHERE heartbeat_at < now() - make_interval(secs => %(stale_after)s))
  FROM {JOB} WHERE status = '{JobStatus.RUNNING}'
 GROUP BY queue
"""

# Jobs finished in the last hour per queue and status (finished_at index), with the
# 5- and 60-minute throughput of completions and the 24 h dead-letter count folded in.
# The 24 h part is an index range on finished_at restricted to dead rows.
FINISHED_RECENT = f"""
SELECT queue, status, count(*) FILTER (WHERE finished_at > now() - make_interval(secs => %(window)s)),
       count(*) FILTER (WHERE finished_at > now() - interval '5 minutes'),
       count(*) FILTER (WHERE finished_at > now() - interval '60 minutes')
  FROM {JOB}
 WHERE finished_at IS NOT NULL AND finished_at > now() - make_interval(secs => %(window)s)
 GROUP BY queue, status
UNION ALL
SELECT NULL, 'dead-recent', count(*), 0, 0
  FROM {JOB}
 WHERE finished_at IS NOT NULL AND finished_at > now() - make_interval(secs => %(dead_window)s)
   AND status = '{JobStatus.DEAD}'
"""

WORKERS = f"""
SELECT id, host, pid, queues, concurrency, started_at, last_seen, now() - last_seen
  FROM {WORKER} ORDER BY last_seen DESC LIMIT 200
"""

# Statistics only: pg_class.reltuples, pg_stats for the status column, and the
# vacuum figures. Nothing here reads the table itself.
HEALTH = f"""
SELECT now(), c.reltuples::bigint, pg_total_relation_size(c.oid),
       COALESCE(s.n_live_tup, 0), COALESCE(s.n_dead_tup, 0),
       s.last_autovacuum, s.last_vacuum, s.last_autoanalyze, COALESCE(s.autovacuum_count, 0),
       (SELECT most_common_vals::text FROM pg_stats
         WHERE schemaname = n.nspname AND tablename = c.relname AND attname = 'status'),
       (SELECT most_common_freqs FROM pg_stats
         WHERE schemaname = n.nspname AND tablename = c.relname AND attname = 'status')
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.oid = '{JOB}'::regclass
"""


def _rows(connection: BaseDatabaseWrapper, statement: str,
          params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or {})
        return list(cursor.fetchall())


def queue_rows(connection: BaseDatabaseWrapper, *, stale_after: float) -> dict[str, QueueRow]:
    """Exact pending/due/running/stuck counts and lag per queue (two queries)."""
    queues: dict[str, QueueRow] = {}
    for name, pending, due, lag in _rows(connection, PENDING_BY_QUEUE):
        row = queues.setdefault(name, QueueRow(name))
        row.pending, row.due, row.lag = pending, due, lag
    for name, running, stuck in _rows(connection, RUNNING_BY_QUEUE, {"stale_after": stale_after}):
        row = queues.setdefault(name, QueueRow(name))
        row.running, row.stuck = running, stuck
    return queues


def finished_recent(
    connection: BaseDatabaseWrapper, queues: dict[str, QueueRow], *,
    window: timedelta = RECENT_WINDOW, dead_window: timedelta = DEAD_WINDOW,
) -> tuple[int, int, int]:
    """Fill ``finished`` of each queue; return (dead in dead_window, completed 5m, 60m)."""
    dead_recent = completed_5m = completed_60m = 0
    rows = _rows(connection, FINISHED_RECENT, {
        "window": max(window.total_seconds(), 3600.0), "dead_window": dead_window.total_seconds(),
    })
    for name, status, in_window, last5, last60 in rows:
        if status == "dead-recent":
            dead_recent = in_window
            continue
        row = queues.setdefault(name, QueueRow(name))
        row.finished[status] = in_window
        if status == JobStatus.COMPLETED:
            completed_5m += last5
            completed_60m += last60
    return dead_recent, completed_5m, completed_60m


def workers(connection: BaseDatabaseWrapper) -> list[WorkerRow]:
    """Registered workers, most recently seen first (at most 200)."""
    import json

    out = []
    for r in _rows(connection, WORKERS):
        queues = json.loads(r[3]) if isinstance(r[3], str | bytes) else r[3]
        out.append(WorkerRow(r[0], r[1], r[2], queues or [], r[4], r[5], r[6], r[7]))
    return out


def table_health(connection: BaseDatabaseWrapper) -> tuple[datetime, TableHealth]:
    """(database now, statistics of the jobs table) from the catalog only."""
    (now, reltuples, size, live, dead, last_av, last_v, last_aa, av_count,
     mcv, freqs) = _rows(connection, HEALTH)[0]
    estimated = int(reltuples) if reltuples >= 0 else None  # -1: never analyzed
    estimates: dict[str, int] = {}
    if mcv and freqs and estimated is not None:
        values = [v.strip('"') for v in mcv.strip("{}").split(",") if v]
        for value, freq in zip(values, freqs, strict=False):
            estimates[value] = round(float(freq) * estimated)
    return now, TableHealth(estimated, estimates, live, dead, size, last_av, last_v, last_aa,
                            av_count)


def estimated_rows(connection: BaseDatabaseWrapper) -> int | None:
    """PostgreSQL's estimate of the jobs table's rows (``pg_class.reltuples``).

    ``None`` when the table was never vacuumed or analyzed (no estimate yet).
    """
    rows = _rows(connection, f"SELECT reltuples::bigint FROM pg_class WHERE oid = '{JOB}'::regclass")
    return int(rows[0][0]) if rows and rows[0][0] >= 0 else None


def active_queues(connection: BaseDatabaseWrapper) -> list[str]:
    """Queues that have pending or running rows (for filter choices).

    Pending: a loose index scan of the claim index, one probe per queue. Running:
    the reaper's partial index, as many rows as jobs in flight. Never the history.
    """
    statement = f"""
    WITH RECURSIVE qs(name) AS (
        (SELECT queue FROM {JOB} WHERE status = '{JobStatus.PENDING}' ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT queue FROM {JOB}
                 WHERE status = '{JobStatus.PENDING}' AND queue > qs.name
                 ORDER BY queue LIMIT 1)
          FROM qs WHERE qs.name IS NOT NULL
    )
    SELECT name FROM qs WHERE name IS NOT NULL
    UNION
    SELECT DISTINCT queue FROM {JOB} WHERE status = '{JobStatus.RUNNING}'
    LIMIT 1000
    """
    return [r[0] for r in _rows(connection, statement)]


def overview(connection: BaseDatabaseWrapper, *, stale_after: float) -> Overview:
    """Everything the overview page shows, in five queries whatever the table size."""
    now, health = table_health(connection)
    queues = queue_rows(connection, stale_after=stale_after)
    dead_recent, c5, c60 = finished_recent(connection, queues)
    return Overview(
        now=now,
        queues=sorted(queues.values(), key=lambda q: q.queue),
        stuck=sum(q.stuck for q in queues.values()),
        dead_recent=dead_recent,
        completed_5m=c5,
        completed_60m=c60,
        workers=workers(connection),
        health=health,
        stale_after=stale_after,
    )
