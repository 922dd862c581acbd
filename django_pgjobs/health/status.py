"""``jobs_status``: queue and table health, cheap enough to run every few seconds.

Nothing here counts over history: live work (pending, running) is counted
exactly from the small partial indexes; finished jobs are counted exactly only
over a recent window (a range scan of the partial ``finished_at`` index) and
table-wide totals are estimates from planner statistics. Table health comes from
``pg_stat_user_tables`` and the catalog. So the cost follows the backlog and the
throughput, not the size of the history. The queries are the admin overview's
(``overview.py``); this module adds the per-queue worker counts, the warnings and
the text and JSON output.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import unknown_pending
from django_pgjobs.db.tables import JOB, RESULT
from django_pgjobs.health import overview
from django_pgjobs.health.overview import QueueCounts, TableHealth
from django_pgjobs.states import FINISHED
from django_pgjobs.support.ages import format_age
from django_pgjobs.support.safetext import printable

#: The storage parameters the migration sets (docs/howto/retention-and-health.md says why).
EXPECTED_AUTOVACUUM = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_cost_limit",
    "autovacuum_vacuum_cost_delay",
)

#: Warn when dead tuples are at least this share of all tuples (and more than a handful).
DEAD_SHARE_WARNING = 0.5
DEAD_MIN_WARNING = 1000


@dataclass
class QueueStatus(QueueCounts):
    lag: float | None = None  # seconds since the oldest due job's run_at
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED, 0))
    workers: int = 0


@dataclass
class Status:
    queues: list[QueueStatus]
    window: float
    workers: list[dict[str, Any]]
    estimated_totals: dict[str, int | None]
    tables: list[TableHealth]
    claim_index_bytes: int
    warnings: list[str]
    # Pending jobs whose task no live worker knows (deploy skew, db/workers.py).
    unknown_tasks: list[dict[str, Any]] = field(default_factory=list)


def _estimates(jobs: TableHealth) -> dict[str, int | None]:
    """All-time finished totals per status from the planner's statistics."""
    if jobs.estimated_rows is None or not jobs.status_estimates:
        return dict.fromkeys(FINISHED, None)  # never analyzed: no estimate rather than a wrong one
    return {s: jobs.status_estimates.get(s, 0) for s in FINISHED}


def collect(*, window: float = 3600.0, alias: str | None = None) -> Status:
    """Everything ``jobs_status`` shows. ``window``: seconds of finished history to count."""
    conf = get_settings()
    connection = connections[alias or conf.DATABASE]
    rows = overview.queue_rows(connection, stale_after=conf.STALE_AFTER)
    overview.finished_by_queue(connection, rows, window=timedelta(seconds=window))
    live = [w for w in overview.workers(connection, limit=None) if w.is_live(conf.STALE_AFTER)]
    workers: list[dict[str, Any]] = [
        {
            "id": w.id,
            "host": w.host,
            "pid": w.pid,
            "queues": w.queues,
            "concurrency": w.concurrency,
            "started_at": w.started_at,
            "last_seen": w.last_seen,
            "degraded": w.degraded,
        }
        for w in sorted(live, key=lambda w: w.id)
    ]
    tables = [
        overview.table_health(connection, JOB)[1],
        overview.table_health(connection, RESULT)[1],
    ]
    claim_index_bytes = overview.relation_size(connection, "pgjobs_job_claim_idx")

    queues = {
        name: QueueStatus(
            name,
            r.pending,
            r.due,
            r.running,
            r.stuck,
            blocked=r.blocked,
            waiting=r.waiting,
            lag=None if r.lag is None else r.lag.total_seconds(),
            finished={**dict.fromkeys(FINISHED, 0), **r.finished},
        )
        for name, r in rows.items()
    }
    for worker in workers:
        for name in worker["queues"]:
            if name != "*":
                queues.setdefault(name, QueueStatus(name))
    for entry in queues.values():
        entry.workers = sum(1 for w in workers if "*" in w["queues"] or entry.queue in w["queues"])
    ordered = sorted(queues.values(), key=lambda e: e.queue)
    status = Status(ordered, window, workers, _estimates(tables[0]), tables, claim_index_bytes, [])

    status.unknown_tasks = unknown_pending(connection, stale_after=conf.STALE_AFTER)
    status.warnings = warnings(status)
    return status


def warnings(status: Status) -> list[str]:
    out: list[str] = []
    jobs = status.tables[0]
    if (
        jobs.dead_share is not None
        and jobs.dead_tuples is not None
        and jobs.dead_share >= DEAD_SHARE_WARNING
        and jobs.dead_tuples >= DEAD_MIN_WARNING
    ):
        out.append(
            f"dead tuples dominate {jobs.table}: {jobs.dead_tuples} dead vs {jobs.live_tuples} "
            "live. Autovacuum is not keeping up or is blocked: look for long-running "
            "transactions (pg_stat_activity.xact_start) and idle-in-transaction sessions, "
            "and check the storage parameters below."
        )
    if not jobs.autovacuum_enabled:
        out.append(
            f"autovacuum is off for {jobs.table} (server setting 'autovacuum' or the table's "
            "autovacuum_enabled): every job leaves two dead tuples that nothing reclaims, so "
            "the table and the claim index will bloat. Turn it on, or VACUUM the table "
            "on a schedule."
        )
    missing = [p for p in EXPECTED_AUTOVACUUM if p not in jobs.storage_parameters]
    if missing:
        out.append(
            f"{jobs.table} lacks the autovacuum storage parameters {', '.join(missing)} "
            "that the migration sets; a busy queue will bloat with the server defaults."
        )
    for entry in status.queues:
        if entry.stuck:
            out.append(
                f"queue {entry.queue!r}: {entry.stuck} running job(s) with a stale "
                "heartbeat (the reaper reclaims them; is any worker running it?)"
            )
        if entry.due and not entry.workers:
            out.append(
                f"queue {entry.queue!r}: {entry.due} job(s) due and no live worker "
                "serves this queue"
            )
    for unknown in status.unknown_tasks:
        out.append(
            f"queue {unknown['queue']!r}: {unknown['pending']} pending job(s) of task "
            f"{unknown['task']!r}, which no live worker knows (oldest "
            f"{format_age(unknown['oldest'], unknown='-')}): they wait for a worker that "
            "registers it (a rolling deploy), and are dead-lettered after UNKNOWN_TASK_TIMEOUT"
        )
    for worker in status.workers:
        if worker["degraded"]:
            out.append(
                f"worker {worker['id']} runs without its heartbeat process "
                f"({worker['degraded']}): until the one it restarts runs, a job holding "
                "the GIL longer than STALE_AFTER can be taken for dead"
            )
    return out


def to_json(status: Status) -> str:
    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(type(value).__name__)

    data = asdict(status)
    for table in data["tables"]:  # the documented JSON: the row estimate as a number, 0 if none
        table["estimated_rows"] = float(table["estimated_rows"] or 0)
        del table["status_estimates"]  # already in estimated_totals
    return json.dumps(data, default=default, indent=2, sort_keys=True)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def _when(value: datetime | None, now: datetime) -> str:
    return "never" if value is None else f"{format_age(now - value)} ago"


def render(status: Status, now: datetime) -> str:
    """The plain-text table ``jobs_status`` prints."""
    window = format_age(status.window)
    headers = [
        "queue",
        "pending",
        "blocked",
        "waiting",
        "due",
        "running",
        "stuck",
        "lag",
        "workers",
        *(f"{s}/{window}" for s in FINISHED),
    ]
    rows = [
        [
            printable(e.queue),
            str(e.pending),
            str(e.blocked),
            str(e.waiting),
            str(e.due),
            str(e.running),
            str(e.stuck),
            format_age(e.lag, unknown="-"),
            str(e.workers),
            *(str(e.finished[s]) for s in FINISHED),
        ]
        for e in status.queues
    ]
    if not rows:
        rows = [["(no jobs)", *["-"] * (len(headers) - 1)]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows), ""]
    est = status.estimated_totals
    if any(v is not None for v in est.values()):
        out.append(
            "all-time finished (estimated from planner statistics): "
            + ", ".join(f"{s} ~{est[s]}" for s in FINISHED)
        )
    else:
        out.append("all-time finished: no estimate yet (table not analyzed)")
    out.append(
        f"live workers: {len(status.workers)}"
        + "".join(
            f"\n  {printable(str(w['id']))} "
            f"queues={printable(','.join(map(str, w['queues'])))} "
            f"concurrency={w['concurrency']} seen {_when(w['last_seen'], now)}"
            + (f" DEGRADED: {printable(str(w['degraded']))}" if w["degraded"] else "")
            for w in status.workers
        )
    )
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
        out.append(f"WARNING: {printable(warning)}")
    return "\n".join(out) + "\n"


__all__ = ["Status", "collect", "render", "to_json"]
