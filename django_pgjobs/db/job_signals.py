"""Signals to a job: the send (in the caller's transaction, waking the job when it
waits for that signal), the lookup of the signal that holds an idempotency key, and a
wait's take of the oldest unconsumed signal.

Locks: ``SIGNAL_SEND`` locks the job's row (``FOR NO KEY UPDATE``, as the park and
the heartbeat do) until the caller's transaction ends; ``SIGNAL_TAKE`` locks the one
signal row it consumes and no job row (the step record that follows in its
transaction locks the job's row, so the order is always signal, then job, and a send,
which locks the job and inserts a new signal, never waits for a taken one).
"""

from __future__ import annotations

from typing import Any

from django_pgjobs.db.moves import declare
from django_pgjobs.db.notify import due_payload
from django_pgjobs.db.tables import JOB, NOTIFY_CHANNEL, SIGNAL, by_id_is
from django_pgjobs.states import FINISHED, JobStatus

WAITING, PENDING = JobStatus.WAITING, JobStatus.PENDING

# Send one signal. The job's row is locked (until the caller's transaction ends) so
# that the job cannot finish, be claimed or park between this statement's look at it
# and the caller's commit; the signal is written only for a job that has not
# finished. A duplicate idempotency key writes nothing (ON CONFLICT on the per-job
# unique key waits for a concurrent sender of the same key, then does nothing).
#
# A new signal bumps the job's ``wakes``: a run that looked for signals before this
# commits parks as pending instead of waiting (JOB_PARK compares ``wakes``), so a
# signal that commits between a run's look and its park is never left unread. A job
# already waiting for this signal's name (``waiting_for`` is what its park stored:
# %(waiting_for)s) goes back to pending, due now, and its queue's workers are told at
# commit through the enqueue's NOTIFY. Returns (the job's status before, the new
# signal's id): no row is an unknown job, a NULL id a finished job or a key used.
SIGNAL_SEND = f"""
WITH target AS (
    SELECT id, status, waiting_for = %(waiting_for)s::jsonb AS wakes_it
      FROM {JOB} WHERE id = %(job_id)s FOR NO KEY UPDATE
), sent AS (
    INSERT INTO {SIGNAL} (job_id, name, payload, idempotency_key)
    SELECT id, %(name)s, %(payload)s::jsonb, %(idempotency_key)s FROM target
     WHERE NOT {by_id_is(*FINISHED)}
    ON CONFLICT (job_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
), woken AS (
    UPDATE {JOB} AS j
       SET wakes = j.wakes + 1,
           status = CASE WHEN t.status = '{WAITING}' AND t.wakes_it
                         THEN '{PENDING}' ELSE j.status END,
           run_at = CASE WHEN t.status = '{WAITING}' AND t.wakes_it THEN now() ELSE j.run_at END,
           waiting_for = CASE WHEN t.status = '{WAITING}' AND t.wakes_it
                              THEN NULL ELSE j.waiting_for END
      FROM target t
     WHERE j.id = t.id AND EXISTS (SELECT 1 FROM sent)
    RETURNING j.status, j.queue, j.priority, j.run_at, t.status AS was
), told AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', {due_payload("queue", "run_at", "priority")})
      FROM woken WHERE was = '{WAITING}' AND status = '{PENDING}'
)
SELECT target.status, (SELECT id FROM sent) FROM target WHERE (SELECT count(*) FROM told) >= 0
"""
declare("SIGNAL_SEND", (WAITING, PENDING))

# The signal that holds an idempotency key for a job (a duplicate send returns it).
SIGNAL_BY_KEY = f"SELECT id FROM {SIGNAL} WHERE job_id = %s AND idempotency_key = %s"

# A wait's look: the job's ``wakes`` and the oldest unconsumed signal of the name,
# consumed (marked with the step that takes it), in one statement, so ``wakes`` is
# read in the snapshot that found no signal (the park compares it). The signal row is
# locked and waited for, never skipped: only a run of the same job takes its signals,
# and a second run at once is a zombie whose step record fails its lease check and
# rolls its take back, after which this statement takes the row. Run in the
# transaction that records the step (``durable/signals.py``): the take and the record
# commit together or not at all.
SIGNAL_TAKE = f"""
WITH taken AS (
    UPDATE {SIGNAL} AS s SET consumed_at = now(), consumed_by = %(step)s
     WHERE s.id = (SELECT id FROM {SIGNAL}
                    WHERE job_id = %(job_id)s AND name = %(name)s AND consumed_at IS NULL
                    ORDER BY id LIMIT 1
                      FOR UPDATE)
       AND s.consumed_at IS NULL
    RETURNING s.id, s.payload
)
SELECT j.wakes, taken.id, taken.payload FROM {JOB} j LEFT JOIN taken ON true
 WHERE j.id = %(job_id)s
"""


def signal_send(cursor: Any, params: dict[str, Any]) -> tuple[str, int | None] | None:
    """Run SIGNAL_SEND: (status, new id or None), or None for an unknown job."""
    cursor.execute(SIGNAL_SEND, params)
    row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def signal_by_key(cursor: Any, job_id: int, key: str) -> int | None:
    cursor.execute(SIGNAL_BY_KEY, [job_id, key])
    row = cursor.fetchone()
    return None if row is None else int(row[0])


def signal_take(
    cursor: Any, *, job_id: int, name: str, step: str
) -> tuple[int, int | None, Any] | None:
    """Run SIGNAL_TAKE: (the job's wakes, the taken signal's id or None, its payload as
    the cursor returns it), or None when the job's row is gone."""
    cursor.execute(SIGNAL_TAKE, {"job_id": job_id, "name": name, "step": step})
    row = cursor.fetchone()
    return None if row is None else (int(row[0]), row[1], row[2])
