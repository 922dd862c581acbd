"""Wake-ups: the NOTIFY that tells idle workers a queue has work (or that the queue rows
changed), and the statements of the worker's LISTEN connection."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django_pgjobs.db.tables import NOTIFY_CHANNEL

#: NOTIFY payload that tells workers the queue rows changed (pause, resume, admin edit).
QUEUES_CHANGED = "pgjobs:queues"

# Wake idle workers: after a bulk COPY (one notification per queue per commit), on a
# resume, and with the payload QUEUES_CHANGED when the queue rows changed. A
# single enqueue notifies inside its own statement (JOB_INSERT). Delivered at
# commit, so a rolled-back change wakes nobody.
JOB_NOTIFY = f"SELECT pg_notify('{NOTIFY_CHANNEL}', %s)"

# A payload may say when its jobs are due and at which priority: ``queue,<epoch
# microseconds>,<priority>`` (queue names hold no comma), the earliest run_at of the
# jobs it announces (or now() if that is later) and their priority. A worker's claims
# start past the jobs they already took and seek only the priorities it knows of
# (claim/front.py); this tells them how far back a job committed late lies, and at
# which priority. Built in SQL by the single enqueue (db/job_insert.py) and here for a
# bulk enqueue (one task, one priority); one transaction's notifications of the same
# queue, time and priority are still folded into one.
_DUE_PAYLOAD = (
    "{queue} || ',' || (extract(epoch FROM least({run_at}, now())) * 1000000)::bigint"
    " || ',' || {priority}"
)
_BULK_RUN_AT = "coalesce(%(run_at)s::timestamptz, now())"
JOB_NOTIFY_DUE = (
    f"SELECT pg_notify('{NOTIFY_CHANNEL}', "
    f"{_DUE_PAYLOAD.format(queue='%(queue)s::text', run_at=_BULK_RUN_AT, priority='%(priority)s::int')})"
)


def due_payload(queue: str, run_at: str, priority: str) -> str:
    """The SQL of a payload announcing jobs of ``queue`` due at ``run_at`` with
    ``priority`` (all three SQL)."""
    return _DUE_PAYLOAD.format(queue=queue, run_at=run_at, priority=priority)


@dataclass(frozen=True)
class Payload:
    """What a NOTIFY said: a queue (or QUEUES_CHANGED, or "" for a reconnected
    LISTEN); when its jobs are due and their priority, when it says (a bare queue
    name, as a workflow's release or ``pgjobs_enqueue()`` sends, does not)."""

    queue: str
    due: datetime | None = None
    priority: int | None = None


def parse_payload(payload: str) -> Payload:
    """The payload's parts; an unreadable time or priority reads as not said."""
    parts = payload.split(",")
    if len(parts) in (2, 3):
        try:
            due = datetime.fromtimestamp(int(parts[1]) / 1_000_000, tz=UTC)
            priority = int(parts[2]) if len(parts) == 3 else None
        except (ValueError, OverflowError, OSError):
            return Payload(payload)
        return Payload(parts[0], due, priority)
    return Payload(payload)


# The worker's LISTEN connection (worker/listener.py, autocommit): subscribe, then a
# keep-alive between waits, which raises on a silently dead connection.
LISTEN = f"LISTEN {NOTIFY_CHANNEL}"
LISTEN_KEEPALIVE = "SELECT 1"
