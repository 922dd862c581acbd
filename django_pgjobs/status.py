"""Queue and table health, cheap enough to run every few seconds in production.

Nothing here counts over history: live work (pending, running) is counted
exactly from the small partial indexes; finished jobs are counted exactly only
over a recent window (a range scan of the partial ``finished_at`` index) and
table-wide totals are estimates from planner statistics. Table health comes from
``pg_stat_user_tables`` and the catalog. So the cost follows the backlog and the
throughput, not the size of the history.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections

from . import sql
from .conf import get_settings
from .states import TERMINAL

FINISHED: tuple[str, ...] = tuple(sorted(str(s) for s in TERMINAL))

#: The storage parameters the migration sets (docs/howto/retention-and-health.md says why).
EXPECTED_AUTOVACUUM = ("autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold",
                       "autovacuum_vacuum_cost_limit", "autovacuum_vacuum_cost_delay")

#: Warn when dead tuples are at least this share of all tuples (and more than a handful).
DEAD_SHARE_WARNING = 0.5
DEAD_MIN_WARNING = 1000


@dataclass
class QueueStatus:
    queue: str
    pending: int = 0
    due: int = 0
    running: int = 0
    stuck: int = 0
    lag: float | None = None  # seconds since the oldest due job's run_at
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED, 0))
    workers: int = 0


@dataclass
class TableHealth:
    table: str
    live_tuples: int | None
    dead_tuples: int | None
    dead_share: float | None
    last_autovacuum: datetime | None
    last_vacuum: datetime | None
    last_autoanalyze: datetime | None
    autovacuum_count: int | None
    storage_parameters: dict[str, str]
    total_bytes: int
    estimated_rows: float


@dataclass
class Status:
    queues: list[QueueStatus]
    window: float
    workers: list[dict[str, Any]]
    estimated_totals: dict[str, int | None]
    tables: list[TableHealth]
    claim_index_bytes: int
    warnings: list[str]


def _storage(reloptions: list[str] | None) -> dict[str, str]:
    return dict(opt.split("=", 1) for opt in (reloptions or []))


def _table_health(cursor: Any, table: str) -> TableHealth:
    cursor.execute(sql.TABLE_HEALTH, {"table": table})
    (_, live, dead, last_auto, last_vac, last_analyze, av_count, reloptions, size,
     reltuples) = cursor.fetchone()
    share = None
    if live is not None and dead is not None and live + dead > 0:
        share = dead / (live + dead)
    return TableHealth(table, live, dead, share, last_auto, last_vac, last_analyze, av_count,
                       _storage(reloptions), int(size), max(float(reltuples), 0.0))


def _estimates(cursor: Any) -> dict[str, int | None]:
    cursor.execute(sql.STATUS_ESTIMATES)
    row = cursor.fetchone()
    out: dict[str, int | None] = dict.fromkeys(FINISHED, None)
    if row is None or row[1] is None or row[0] < 0:
        return out  # never analyzed: no estimate rather than a wrong one
    reltuples, mcv_text, freqs = row
    values = mcv_text.strip("{}").split(",") if mcv_text else []
    for status in FINISHED:
        out[status] = 0
    for value, freq in zip(values, freqs or [], strict=False):
        value = value.strip('"')
        if value in out:
            out[value] = round(reltuples * freq)
    return out


def collect(*, window: float = 3600.0, alias: str | None = None) -> Status:
    """Everything ``jobs_status`` shows. ``window``: seconds of finished history to count."""
    conf = get_settings()
    alias = alias or conf.DATABASE
    queues: dict[str, QueueStatus] = {}

    def q(name: str) -> QueueStatus:
        return queues.setdefault(name, QueueStatus(name))

    with connections[alias].cursor() as cursor:
        cursor.execute(sql.STATUS_ACTIVE, {"stale_after": conf.STALE_AFTER})
        for name, pending, due, running, stuck, lag in cursor.fetchall():
            entry = q(name)
            entry.pending, entry.due, entry.running, entry.stuck = pending, due, running, stuck
            entry.lag = lag
        cursor.execute(sql.STATUS_FINISHED, {"window": window})
        for name, status, count in cursor.fetchall():
            q(name).finished[status] = count
        cursor.execute(sql.STATUS_WORKERS, {"stale_after": conf.STALE_AFTER})
        workers = []
        for wid, host, pid, wqueues, concurrency, started, last_seen in cursor.fetchall():
            names = json.loads(wqueues) if isinstance(wqueues, str) else wqueues
            workers.append({"id": wid, "host": host, "pid": pid, "queues": names,
                            "concurrency": concurrency, "started_at": started,
                            "last_seen": last_seen})
        estimates = _estimates(cursor)
        tables = [_table_health(cursor, sql.JOB), _table_health(cursor, sql.RESULT)]
        cursor.execute(sql.INDEX_SIZE, {"index": "pgjobs_job_claim_idx"})
        claim_index_bytes = int(cursor.fetchone()[0])
    for worker in workers:
        for name in worker["queues"]:
            if name != "*":
                q(name)
    for entry in queues.values():
        entry.workers = sum(1 for w in workers
                            if "*" in w["queues"] or entry.queue in w["queues"])
    ordered = sorted(queues.values(), key=lambda e: e.queue)
    status = Status(ordered, window, workers, estimates, tables, claim_index_bytes, [])
    status.warnings = warnings(status)
    return status


def warnings(status: Status) -> list[str]:
    out: list[str] = []
    jobs = status.tables[0]
    if (jobs.dead_share is not None and jobs.dead_tuples is not None
            and jobs.dead_share >= DEAD_SHARE_WARNING and jobs.dead_tuples >= DEAD_MIN_WARNING):
        out.append(
            f"dead tuples dominate {jobs.table}: {jobs.dead_tuples} dead vs {jobs.live_tuples} "
            "live. Autovacuum is not keeping up or is blocked: look for long-running "
            "transactions (pg_stat_activity.xact_start) and idle-in-transaction sessions, "
            "and check the storage parameters below."
        )
    missing = [p for p in EXPECTED_AUTOVACUUM if p not in jobs.storage_parameters]
    if missing:
        out.append(f"{jobs.table} lacks the autovacuum storage parameters {', '.join(missing)} "
                   "that the migration sets; a busy queue will bloat with the server defaults.")
    for entry in status.queues:
        if entry.stuck:
            out.append(f"queue {entry.queue!r}: {entry.stuck} running job(s) with a stale "
                       "heartbeat (the reaper reclaims them; is any worker running it?)")
        if entry.due and not entry.workers:
            out.append(f"queue {entry.queue!r}: {entry.due} job(s) due and no live worker "
                       "serves this queue")
    return out


def to_json(status: Status) -> str:
    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(type(value).__name__)

    return json.dumps(asdict(status), default=default, indent=2, sort_keys=True)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def _when(value: datetime | None, now: datetime) -> str:
    return "never" if value is None else f"{_age((now - value).total_seconds())} ago"


def render(status: Status, now: datetime) -> str:
    """The plain-text table ``jobs_status`` prints."""
    window = _age(status.window).replace(".0", "")
    headers = ["queue", "pending", "due", "running", "stuck", "lag", "workers",
               *(f"{s}/{window}" for s in FINISHED)]
    rows = [[e.queue, str(e.pending), str(e.due), str(e.running), str(e.stuck),
             _age(e.lag), str(e.workers), *(str(e.finished[s]) for s in FINISHED)]
            for e in status.queues]
    if not rows:
        rows = [["(no jobs)", *["-"] * (len(headers) - 1)]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows), ""]
    est = status.estimated_totals
    if any(v is not None for v in est.values()):
        out.append("all-time finished (estimated from planner statistics): "
                   + ", ".join(f"{s} ~{est[s]}" for s in FINISHED))
    else:
        out.append("all-time finished: no estimate yet (table not analyzed)")
    out.append(f"live workers: {len(status.workers)}"
               + "".join(f"\n  {w['id']} queues={','.join(w['queues'])} "
                         f"concurrency={w['concurrency']} seen {_when(w['last_seen'], now)}"
                         for w in status.workers))
    for table in status.tables:
        share = "-" if table.dead_share is None else f"{table.dead_share:.0%}"
        params = ", ".join(f"{k}={v}" for k, v in sorted(table.storage_parameters.items()))
        out.append(
            f"table {table.table}: {_size(table.total_bytes)}, live tuples "
            f"{table.live_tuples if table.live_tuples is not None else '-'}, dead tuples "
            f"{table.dead_tuples if table.dead_tuples is not None else '-'} ({share}), "
            f"last autovacuum {_when(table.last_autovacuum, now)}, last vacuum "
            f"{_when(table.last_vacuum, now)}, last autoanalyze "
            f"{_when(table.last_autoanalyze, now)}"
        )
        out.append(f"  storage parameters: {params or '(server defaults)'}")
    out.append(f"claim index pgjobs_job_claim_idx: {_size(status.claim_index_bytes)}")
    for warning in status.warnings:
        out.append(f"WARNING: {warning}")
    return "\n".join(out) + "\n"


__all__ = ["Status", "collect", "render", "to_json"]
