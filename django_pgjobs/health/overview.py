"""Read-only queries that describe the queue: what the admin overview and ``jobs_status`` show.

This module runs every status query of both (the statements are in ``db/reports.py``);
each page then formats what it needs. Each function runs **one** query whose
cost depends on the live work (pending and running rows), on the minute rollup of
finished jobs (``db/rollup.py``: minutes and queues, not jobs), or on PostgreSQL's
statistics — never on the size of the job history nor on the throughput. So the
overview answers in a constant number of queries, in milliseconds, with millions of
finished rows in the table and hundreds of finishes a second.

What each number means (also in ``docs/howto/operate-the-queue.md``):

* pending / due / running / stuck / blocked / waiting: exact counts (partial indexes
  hold only live rows; blocked: workflow jobs waiting for their parents, waiting:
  durable jobs parked in a sleep or a wait; neither is part of pending);
* lag: age of the oldest *due* pending job per queue (``None`` when nothing is due);
* completed / dead / cancelled per queue: exact counts of jobs that *finished in
  the window* (the overview's is the last hour, ``RECENT_WINDOW``; windows start on a
  minute), read from the minute rollup plus the jobs finished since its mark;
* table-wide per-status totals: PostgreSQL's estimate from ``pg_stats`` (as fresh
  as the last ANALYZE), never a ``count(*)`` over the history;
* throughput: jobs completed in the last 5 and 60 whole minutes and the current one
  so far (``rate_5m``, ``rate_60m``: per second over exactly that span);
* dead-lettered in the last 24 hours (from the start of that minute): exact, from
  the minute rollup plus the jobs finished since its mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.db.reports import (
    ACTIVE_QUEUES,
    FAIR_KEYS_BUSIEST,
    FAIR_WAIT,
    INDEX_SIZE,
    PENDING_FAIR_KEYS,
    STATUS_ACTIVE,
    STATUS_DEAD_RECENT,
    STATUS_FINISHED,
    STATUS_WORKERS,
    TABLE_ESTIMATE,
    TABLE_HEALTH,
)
from django_pgjobs.db.store import STATUS_BLOCKED
from django_pgjobs.db.tables import JOB
from django_pgjobs.states import TERMINAL, JobStatus
from django_pgjobs.support import decoding

#: The window of the overview's per-queue counts of finished jobs.
RECENT_WINDOW = timedelta(hours=1)
#: The window of the "dead-lettered recently" count.
DEAD_WINDOW = timedelta(hours=24)
#: The longest throughput figure: a finished-jobs window shorter than this undercounts it.
THROUGHPUT_WINDOW = timedelta(minutes=60)

#: The finished statuses (``states.TERMINAL``) in the order of ``JobStatus``: the
#: overview's columns read completed, dead, cancelled.
FINISHED_STATUSES = tuple(s for s in JobStatus if s in TERMINAL)


@dataclass
class QueueCounts:
    """A queue's live work, counted exactly (the part every status page shares)."""

    queue: str
    pending: int = 0
    due: int = 0
    running: int = 0
    stuck: int = 0
    #: workflow jobs waiting for their parents: not claimable, not part of pending
    blocked: int = 0
    #: durable jobs parked in a sleep or a wait: not claimable, holding no worker
    waiting: int = 0


@dataclass
class QueueRow(QueueCounts):
    """One queue's line of the overview."""

    lag: timedelta | None = None
    finished: dict[str, int] = field(default_factory=dict)  # status -> count in the window

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
    #: why it runs without its heartbeat process (empty: it has one)
    degraded: str = ""

    def is_live(self, stale_after: float) -> bool:
        return self.last_seen_age.total_seconds() <= stale_after


@dataclass
class TableHealth:
    """``pg_class`` / ``pg_stat_user_tables`` / ``pg_stats`` figures for one table."""

    table: str
    live_tuples: int
    dead_tuples: int
    dead_share: float | None  # None: no tuples at all
    last_autovacuum: datetime | None
    last_vacuum: datetime | None
    last_autoanalyze: datetime | None
    autovacuum_count: int
    storage_parameters: dict[str, str]
    total_bytes: int
    estimated_rows: int | None  # None: never analyzed yet
    # status -> estimated rows, from the status column's statistics (jobs table only);
    # empty when there are none yet.
    status_estimates: dict[str, int] = field(default_factory=dict)
    # False when autovacuum is off for the server or for this table.
    autovacuum_enabled: bool = True

    @property
    def dead_ratio(self) -> float:
        return self.dead_share or 0.0


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

    def _span(self, minutes: int) -> float:
        # whole minutes plus the current one so far (the rollup counts whole minutes)
        return minutes * 60 + self.now.second + self.now.microsecond / 1e6

    @property
    def rate_5m(self) -> float:
        """Completions per second over the span ``completed_5m`` counts."""
        return self.completed_5m / self._span(5)

    @property
    def rate_60m(self) -> float:
        return self.completed_60m / self._span(60)


def _rows(
    connection: BaseDatabaseWrapper, statement: str, params: dict[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or {})
        return list(cursor.fetchall())


def queue_rows(connection: BaseDatabaseWrapper, *, stale_after: float) -> dict[str, QueueRow]:
    """Exact pending/due/running/stuck/waiting counts and lag per queue, and blocked
    counts (two queries, each aggregate through its partial index)."""
    rows = {
        name: QueueRow(name, pending, due, running, stuck, lag=lag, waiting=waiting)
        for name, pending, due, running, stuck, lag, waiting in _rows(
            connection, STATUS_ACTIVE, {"stale_after": stale_after}
        )
    }
    for name, blocked in _rows(connection, STATUS_BLOCKED):
        rows.setdefault(name, QueueRow(name)).blocked = blocked
    return rows


def finished_by_queue(
    connection: BaseDatabaseWrapper,
    queues: dict[str, QueueRow],
    *,
    window: timedelta,
) -> tuple[int, int]:
    """Fill ``finished`` of each queue over ``window`` (from the start of its first
    minute); return the completions of the last 5 and 60 whole minutes and the current
    one so far. The 60-minute figure is complete only when ``window`` is at least an hour.
    """
    completed_5m = completed_60m = 0
    for name, status, in_window, last5, last60 in _rows(
        connection, STATUS_FINISHED, {"window": window.total_seconds()}
    ):
        queues.setdefault(name, QueueRow(name)).finished[status] = in_window
        if status == JobStatus.COMPLETED:
            completed_5m += last5
            completed_60m += last60
    return completed_5m, completed_60m


def dead_recent(connection: BaseDatabaseWrapper, *, window: timedelta = DEAD_WINDOW) -> int:
    """Jobs dead-lettered within ``window``, from the start of its first minute (exact)."""
    return int(_rows(connection, STATUS_DEAD_RECENT, {"window": window.total_seconds()})[0][0])


def workers(connection: BaseDatabaseWrapper, *, limit: int | None = 200) -> list[WorkerRow]:
    """Registered workers, most recently seen first (at most ``limit``; ``None``: all)."""
    out = []
    for r in _rows(connection, STATUS_WORKERS, {"limit": limit}):
        # A hostile row (psql) shows a placeholder; it never fails the report.
        queues = decoding.loads(r[3]) if isinstance(r[3], str | bytes) else r[3]
        if not isinstance(queues, list) or isinstance(queues, decoding.Undecodable):
            queues = [] if queues is None else [queues]
        queues = [decoding.as_text(q) for q in queues]
        degraded = decoding.as_text(r[8], limit=500) if r[8] else ""
        out.append(WorkerRow(r[0], r[1], r[2], queues or [], r[4], r[5], r[6], r[7], degraded))
    return out


def table_health(connection: BaseDatabaseWrapper, table: str = JOB) -> tuple[datetime, TableHealth]:
    """(database now, statistics of ``table``) from the catalog only."""
    (
        now,
        name,
        reltuples,
        size,
        live,
        dead,
        last_av,
        last_v,
        last_aa,
        av_count,
        reloptions,
        mcv,
        freqs,
        autovacuum,
    ) = _rows(connection, TABLE_HEALTH, {"table": table})[0]
    estimated = round(reltuples) if reltuples >= 0 else None  # -1: never analyzed
    estimates: dict[str, int] = {}
    if mcv and freqs and estimated is not None:
        values = [v.strip('"') for v in mcv.strip("{}").split(",") if v]
        for value, freq in zip(values, freqs, strict=False):
            estimates[value] = round(float(freq) * estimated)
    return now, TableHealth(
        table=name,
        live_tuples=live,
        dead_tuples=dead,
        dead_share=dead / (live + dead) if live + dead else None,
        last_autovacuum=last_av,
        last_vacuum=last_v,
        last_autoanalyze=last_aa,
        autovacuum_count=av_count,
        storage_parameters=dict(opt.split("=", 1) for opt in (reloptions or [])),
        total_bytes=int(size),
        estimated_rows=estimated,
        status_estimates=estimates,
        autovacuum_enabled=bool(autovacuum),
    )


def estimated_rows(connection: BaseDatabaseWrapper) -> int | None:
    """PostgreSQL's estimate of the jobs table's rows (``pg_class.reltuples``).

    ``None`` when the table was never vacuumed or analyzed (no estimate yet).
    """
    rows = _rows(connection, TABLE_ESTIMATE, {"table": JOB})
    return int(rows[0][0]) if rows and rows[0][0] >= 0 else None


def relation_size(connection: BaseDatabaseWrapper, name: str) -> int:
    """Bytes on disk of one table or index (e.g. the claim index), main fork only."""
    return int(_rows(connection, INDEX_SIZE, {"index": name})[0][0])


def fair_waits(connection: BaseDatabaseWrapper) -> dict[str, float]:
    """Per queue with fair keys: the longest a key with a due job and none running has
    waited, in seconds (``FAIR_WAIT``)."""
    return {str(queue): float(age) for queue, age in _rows(connection, FAIR_WAIT)}


#: The queue page's busiest fair keys: how many it shows, among how many keys (in key
#: order), each counted up to how many pending jobs.
BUSIEST_SHOWN, BUSIEST_KEYS_READ, BUSIEST_COUNT_CAP = 10, 200, 1000


def busiest_fair_keys(connection: BaseDatabaseWrapper, queue: str) -> list[tuple[str, int]]:
    """The fair keys of ``queue`` with the most pending jobs, most first: (key,
    pending). A count of ``BUSIEST_COUNT_CAP`` means at least that many; only the first
    ``BUSIEST_KEYS_READ`` keys in key order are counted (``FAIR_KEYS_BUSIEST``)."""
    params = {
        "queue": queue,
        "keys": BUSIEST_KEYS_READ,
        "cap": BUSIEST_COUNT_CAP,
        "top": BUSIEST_SHOWN,
    }
    return [(str(key), int(n)) for key, n in _rows(connection, FAIR_KEYS_BUSIEST, params)]


def pending_fair_keys(connection: BaseDatabaseWrapper) -> list[str]:
    """Fair keys of pending jobs (for filter choices; at most 200 queue and key pairs)."""
    return sorted(r[0] for r in _rows(connection, PENDING_FAIR_KEYS))


def active_queues(connection: BaseDatabaseWrapper) -> list[str]:
    """Queues that have pending or running rows (for filter choices); never the history."""
    return [r[0] for r in _rows(connection, ACTIVE_QUEUES)]


def overview(connection: BaseDatabaseWrapper, *, stale_after: float) -> Overview:
    """Everything the overview page shows, in five queries whatever the table size."""
    now, health = table_health(connection)
    queues = queue_rows(connection, stale_after=stale_after)
    c5, c60 = finished_by_queue(connection, queues, window=max(RECENT_WINDOW, THROUGHPUT_WINDOW))
    return Overview(
        now=now,
        queues=sorted(queues.values(), key=lambda q: q.queue),
        stuck=sum(q.stuck for q in queues.values()),
        dead_recent=dead_recent(connection),
        completed_5m=c5,
        completed_60m=c60,
        workers=workers(connection),
        health=health,
        stale_after=stale_after,
    )
