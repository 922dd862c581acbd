"""Signals to a job: the send (in the caller's transaction, waking the job when it
waits for that signal), the lookup of the signal that holds an idempotency key, a
wait's take of the oldest unconsumed signal, and the park's check for a send in flight.

Locks: a send takes the job's advisory lock shared (``SIGNAL_LOCK_SHARED``, a
statement of its own, held until the caller's transaction ends) and locks the job's
row only when it wakes it: a row ``waiting`` for that signal, which no heartbeat or
outcome write touches. A running job's row is never locked by a send (in READ
COMMITTED), so a caller's open transaction never holds up its worker. A wait's look
takes the advisory lock exclusively (``SIGNAL_LOCK``) before its take: it runs after
every send in flight to the job has committed, in a later snapshot, which has their
signals. The park (``JOB_PARK``) takes it with ``SIGNAL_PARK_TRY``, never waiting: when
a send holds it, the park makes the job pending; when the park gets it, every earlier
send has committed and the park's next statement sees their signals, and a later send
waits for the park's commit, then finds the row waiting and wakes it.

``SIGNAL_TAKE`` locks the one signal row it consumes and no job row (the step record
that follows in its transaction locks the job's row: the order is always advisory,
signal, then job).
"""

from __future__ import annotations

from typing import Any

from django_pgjobs.db.moves import declare
from django_pgjobs.db.notify import due_payload
from django_pgjobs.db.tables import JOB, NOTIFY_CHANNEL, SIGNAL, by_id_is
from django_pgjobs.states import FINISHED, JobStatus

WAITING, PENDING = JobStatus.WAITING, JobStatus.PENDING

#: The first key of the two-int advisory locks on a job's signals: "pjsg".
SIGNAL_LOCK_SPACE = 0x706A7367

# The lock's second key, from the job's id (two ids 2**31 - 1 apart share a lock: a
# look waits a moment longer, nothing else).
_SIGNAL_LOCK_KEY = "mod(%(job_id)s::bigint, 2147483647)::int"

# A send's lock (see the module docstring), held until the caller's transaction ends.
SIGNAL_LOCK_SHARED = f"SELECT pg_advisory_xact_lock_shared({SIGNAL_LOCK_SPACE}, {_SIGNAL_LOCK_KEY})"

# A wait's lock, held until its look's transaction ends: waits for the sends in flight.
SIGNAL_LOCK = f"SELECT pg_advisory_xact_lock({SIGNAL_LOCK_SPACE}, {_SIGNAL_LOCK_KEY})"

# The park's lock, in the park's transaction, before its statement: never waits
# (false: a send is in flight, and the park makes the job pending).
SIGNAL_PARK_TRY = f"SELECT pg_try_advisory_xact_lock({SIGNAL_LOCK_SPACE}, {_SIGNAL_LOCK_KEY})"

# Send one signal, behind SIGNAL_LOCK_SHARED. The job's row is read without a lock;
# the signal is written only for a job that has not finished (one that finishes while
# the caller's transaction is open keeps it unread, as a signal sent just before its
# end). A duplicate idempotency key writes nothing (ON CONFLICT on the per-job unique
# key waits for a concurrent sender of the same key, then does nothing).
#
# A job waiting for this signal's name (``waiting_for`` is what its park stored:
# %(waiting_for)s) goes back to pending, due now, its ``wakes`` bumped, and its
# queue's workers are told at commit through the enqueue's NOTIFY: the UPDATE locks
# that waiting row, and re-checks it is still waiting once it has the lock. Any other
# row is left alone: a running run's look waits for this commit (SIGNAL_LOCK), its
# park sees the signal or this send in flight (SIGNAL_PARK_TRY), and a pending job's
# next run looks.
#
# ``guard``: a REPEATABLE READ or SERIALIZABLE caller's snapshot may predate a park
# that committed before this send got its lock; it locks the row instead, as before
# (``FOR NO KEY UPDATE``: a row changed since its snapshot is a serialization error,
# which the caller retries), and holds up the row's heartbeat until it commits.
# Returns (the job's status, the new signal's id): no row is an unknown job, a NULL
# id a finished job or a key used.
SIGNAL_SEND = f"""
WITH guard AS (
    SELECT id FROM {JOB}
     WHERE id = %(job_id)s AND current_setting('transaction_isolation') <> 'read committed'
       FOR NO KEY UPDATE
), target AS (
    SELECT id, status FROM {JOB} WHERE id = %(job_id)s AND (SELECT count(*) FROM guard) >= 0
), sent AS (
    INSERT INTO {SIGNAL} (job_id, name, payload, idempotency_key)
    SELECT id, %(name)s, %(payload)s::jsonb, %(idempotency_key)s FROM target
     WHERE NOT {by_id_is(*FINISHED)}
    ON CONFLICT (job_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
), woken AS (
    UPDATE {JOB} AS j
       SET wakes = j.wakes + 1, status = '{PENDING}', run_at = now(), waiting_for = NULL
     WHERE j.id = %(job_id)s AND {by_id_is(WAITING, column="j.status")}
       AND j.waiting_for = %(waiting_for)s::jsonb AND EXISTS (SELECT 1 FROM sent)
    RETURNING j.queue, j.priority, j.run_at
), told AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', {due_payload("queue", "run_at", "priority")})
      FROM woken
)
SELECT target.status, (SELECT id FROM sent) FROM target WHERE (SELECT count(*) FROM told) >= 0
"""
declare("SIGNAL_SEND", (WAITING, PENDING))

# The signal that holds an idempotency key for a job (a duplicate send returns it).
SIGNAL_BY_KEY = f"SELECT id FROM {SIGNAL} WHERE job_id = %s AND idempotency_key = %s"

# A wait's look, behind SIGNAL_LOCK: the job's ``wakes`` and the oldest unconsumed signal of the name,
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
    """The job's signal lock, shared, then SIGNAL_SEND: INSERT a signal and wake its
    waiting job, two statements of one transaction (the caller's). (status, new id or
    None), or None for an unknown job."""
    cursor.execute(SIGNAL_LOCK_SHARED, params)
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
    """The job's signal lock, exclusive, then SIGNAL_TAKE: UPDATE the oldest unconsumed
    signal to consumed, locking that row; two statements of one transaction (the one
    that records the step). (the job's wakes, the taken signal's id or None, its
    payload as the cursor returns it), or None when the job's row is gone."""
    params = {"job_id": job_id, "name": name, "step": step}
    cursor.execute(SIGNAL_LOCK, params)
    cursor.execute(SIGNAL_TAKE, params)
    row = cursor.fetchone()
    return None if row is None else (int(row[0]), row[1], row[2])
