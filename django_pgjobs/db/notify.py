"""Wake-ups: the NOTIFY that tells idle workers a queue has work (or that the queue rows
changed), and the statements of the worker's LISTEN connection."""

from __future__ import annotations

from datetime import UTC, datetime

from django_pgjobs.db.tables import NOTIFY_CHANNEL

# Wake idle workers: after a bulk COPY (one notification per queue per commit), on a
# resume, and with the payload flow.QUEUES_CHANGED when the queue rows changed. A
# single enqueue notifies inside its own statement (JOB_INSERT). Delivered at
# commit, so a rolled-back change wakes nobody.
JOB_NOTIFY = f"SELECT pg_notify('{NOTIFY_CHANNEL}', %s)"

# A payload may carry when its jobs are due: ``queue,<epoch microseconds>`` (queue
# names hold no comma), the earliest run_at of the jobs it announces, or now() if
# that is later. A worker's claims start past the jobs they already took
# (claim_front.py); this tells them how far back a job committed late lies. Built
# in SQL by the single enqueue (db/job_insert.py) and here for a bulk enqueue; one
# transaction's notifications of the same queue and time are still folded into one.
_DUE_PAYLOAD = "{queue} || ',' || (extract(epoch FROM least({run_at}, now())) * 1000000)::bigint"
_BULK_RUN_AT = "coalesce(%(run_at)s::timestamptz, now())"
JOB_NOTIFY_DUE = (
    f"SELECT pg_notify('{NOTIFY_CHANNEL}', "
    f"{_DUE_PAYLOAD.format(queue='%(queue)s::text', run_at=_BULK_RUN_AT)})"
)


def due_payload(queue: str, run_at: str) -> str:
    """The SQL of a payload announcing jobs of ``queue`` due at ``run_at`` (both SQL)."""
    return _DUE_PAYLOAD.format(queue=queue, run_at=run_at)


def parse_payload(payload: str) -> tuple[str, datetime | None]:
    """(queue or other payload, when its jobs are due; None when it does not say)."""
    queue, comma, micros = payload.rpartition(",")
    if comma:
        try:
            return queue, datetime.fromtimestamp(int(micros) / 1_000_000, tz=UTC)
        except (ValueError, OverflowError, OSError):
            pass
    return payload, None


# The worker's LISTEN connection (worker/listener.py, autocommit): subscribe, then a
# keep-alive between waits, which raises on a silently dead connection.
LISTEN = f"LISTEN {NOTIFY_CHANNEL}"
LISTEN_KEEPALIVE = "SELECT 1"
