"""Signals to a job: the send (in the caller's transaction) and the lookup of the
signal that already holds an idempotency key."""

from __future__ import annotations

from typing import Any

from django_pgjobs.db.tables import JOB, SIGNAL, by_id_is
from django_pgjobs.states import FINISHED

# Send one signal: the job's row is locked (FOR NO KEY UPDATE, until the caller's
# transaction ends) so that the job cannot finish, be claimed or park between this
# statement's look at its status and the caller's commit; the signal is written only
# for a job that has not finished. A duplicate idempotency key writes nothing (ON
# CONFLICT on the per-job unique key waits for a concurrent sender of the same key,
# then does nothing). Returns (the job's status, the new signal's id): no row is an
# unknown job, a NULL id a finished job or a key already used.
SIGNAL_SEND = f"""
WITH target AS (
    SELECT id, status FROM {JOB} WHERE id = %(job_id)s FOR NO KEY UPDATE
), sent AS (
    INSERT INTO {SIGNAL} (job_id, name, payload, idempotency_key)
    SELECT id, %(name)s, %(payload)s::jsonb, %(idempotency_key)s FROM target
     WHERE NOT {by_id_is(*FINISHED)}
    ON CONFLICT (job_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT target.status, (SELECT id FROM sent) FROM target
"""

# The signal that holds an idempotency key for a job (a duplicate send returns it).
SIGNAL_BY_KEY = f"SELECT id FROM {SIGNAL} WHERE job_id = %s AND idempotency_key = %s"


def signal_send(cursor: Any, params: dict[str, Any]) -> tuple[str, int | None] | None:
    """Run SIGNAL_SEND: (status, new id or None), or None for an unknown job."""
    cursor.execute(SIGNAL_SEND, params)
    row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def signal_by_key(cursor: Any, job_id: int, key: str) -> int | None:
    cursor.execute(SIGNAL_BY_KEY, [job_id, key])
    row = cursor.fetchone()
    return None if row is None else int(row[0])
