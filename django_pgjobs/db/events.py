"""Events by name and key: the emit (in the caller's transaction, behind a shared lock
on its name and key, waking the jobs that wait on them), a wait's look (behind the
same lock, exclusive), and the pruner's batch.

Why no wait misses an event: an emit takes the lock shared, in a statement of its own
before its insert, and holds it until the caller's transaction ends; a wait's look
takes it exclusively, in a statement of its own before it reads. So the look runs
after every emit of that (name, key) in flight has committed, and reads in a later
snapshot, which has their events. When it finds none it writes what it waits for on
its running row (``waiting_for``) in the same transaction, and an emit that starts
after that commit finds the row by it (a later snapshot again) and bumps ``wakes``;
the park, which compares ``wakes`` with the look's, then makes the job pending
instead of waiting. Emits of one (name, key) never wait on each other (shared).
"""

from __future__ import annotations

from typing import Any

from django_pgjobs.db.moves import declare
from django_pgjobs.db.notify import due_payload
from django_pgjobs.db.tables import EVENT, JOB, NOTIFY_CHANNEL, by_id_is
from django_pgjobs.states import JobStatus

WAITING, PENDING, RUNNING = JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING

#: The first key of the two-int advisory locks on an event's (name, key): "pjev".
EVENT_LOCK_SPACE = 0x706A6576

# The lock's second key, from the name and the key (a JSON array tells a NULL key from
# an empty one). Two (name, key) pairs that share a hash only share the lock: a look
# waits a moment longer.
_EVENT_LOCK_KEY = "hashtext(json_build_array(%(name)s::text, %(key)s::text)::text)"

# An emit's lock (see the module docstring), held until the caller's transaction ends.
EVENT_LOCK_SHARED = f"SELECT pg_advisory_xact_lock_shared({EVENT_LOCK_SPACE}, {_EVENT_LOCK_KEY})"

# A wait's lock, held until its look's transaction ends.
EVENT_LOCK = f"SELECT pg_advisory_xact_lock({EVENT_LOCK_SPACE}, {_EVENT_LOCK_KEY})"

# Store the event and wake every job waiting on its (name, key): a waiting job goes
# back to pending, due now (its queue's workers told at commit, one NOTIFY per queue
# and priority), and a running one that looked already has its ``wakes`` bumped, so
# its park makes it pending. The jobs are found by what they wait for, through the
# partial index on ``waiting_for`` (rows that wait, or are about to). Returns the
# event's id and how many jobs it woke.
EVENT_INSERT = f"""
WITH ev AS (
    INSERT INTO {EVENT} (name, key, payload) VALUES (%(name)s, %(key)s, %(payload)s::jsonb)
    RETURNING id
), woken AS (
    UPDATE {JOB} AS j
       SET wakes = j.wakes + 1,
           status = CASE WHEN j.status = '{WAITING}' THEN '{PENDING}' ELSE j.status END,
           run_at = CASE WHEN j.status = '{WAITING}' THEN now() ELSE j.run_at END,
           waiting_for = CASE WHEN j.status = '{WAITING}' THEN NULL ELSE j.waiting_for END
     WHERE j.waiting_for = %(waiting_for)s::jsonb
       AND j.status IN ('{WAITING}', '{RUNNING}')
    RETURNING j.status, j.queue, j.priority, j.run_at
), told AS (
    SELECT DISTINCT ON (queue, priority)
           pg_notify('{NOTIFY_CHANNEL}', {due_payload("queue", "run_at", "priority")})
      FROM woken WHERE status = '{PENDING}' ORDER BY queue, priority, run_at
)
SELECT (SELECT id FROM ev), (SELECT count(*) FROM woken) WHERE (SELECT count(*) FROM told) >= 0
"""
declare("EVENT_INSERT", (WAITING, PENDING))


def _look(key_test: str) -> str:
    # The oldest event of (name, key) since %(since)s (the wait's arrival less its
    # lookback), through the (name, key, created_at) index; when there is none, what
    # the wait waits for is written on the job's row while it still runs under this
    # lease. ``wakes`` is read in the look's snapshot. Returns (wakes, event id,
    # payload, whether the row was still ours).
    return f"""
WITH found AS (
    SELECT id, payload FROM {EVENT}
     WHERE name = %(name)s AND {key_test} AND created_at >= %(since)s
     ORDER BY created_at, id
     LIMIT 1
), intent AS (
    UPDATE {JOB} SET waiting_for = %(waiting_for)s::jsonb
     WHERE id = %(job_id)s AND lease = %(lease)s AND {by_id_is(RUNNING)}
       AND %(park)s AND NOT EXISTS (SELECT 1 FROM found)
    RETURNING id
)
SELECT j.wakes, (SELECT id FROM found), (SELECT payload FROM found),
       j.lease = %(lease)s AND {by_id_is(RUNNING, column="j.status")}
  FROM {JOB} j WHERE j.id = %(job_id)s AND (SELECT count(*) FROM intent) >= 0
"""


EVENT_LOOK = _look("key = %(key)s")
# An event without a key (another text, so each plan probes the index on both columns).
EVENT_LOOK_NO_KEY = _look("key IS NULL")

# Delete one batch of events older than their retention, oldest first (the created_at
# index), each batch its own short transaction; SKIP LOCKED lets pruners on many hosts
# take disjoint rows. No "--" comment inside: pg_cron runs this text flattened.
EVENT_PRUNE_BATCH = f"""
WITH doomed AS (
    SELECT id FROM {EVENT}
     WHERE created_at < now() - make_interval(secs => %(older_than)s)
     ORDER BY created_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {EVENT} AS e USING doomed WHERE e.id = doomed.id RETURNING e.id
)
SELECT count(*) FROM gone
"""

# Dry run of the above: how many events would go. Reads only.
EVENT_PRUNE_COUNT = f"""
SELECT count(*) FROM {EVENT} WHERE created_at < now() - make_interval(secs => %(older_than)s)
"""


def event_emit(cursor: Any, params: dict[str, Any]) -> int:
    """The shared lock on (name, key), then EVENT_INSERT: INSERT an event and wake its
    waiting jobs, two statements of one transaction (the caller's). Returns the event's
    id."""
    cursor.execute(EVENT_LOCK_SHARED, params)
    cursor.execute(EVENT_INSERT, params)
    return int(cursor.fetchone()[0])


def event_look(cursor: Any, params: dict[str, Any]) -> tuple[int, int | None, Any, bool] | None:
    """The exclusive lock on (name, key), then EVENT_LOOK, the read of the event a wait
    gets: two statements of one transaction (the caller's, which records the step).
    (wakes, event id or None, its payload as the cursor returns it, whether the run
    still holds the job), or None when the job's row is gone."""
    cursor.execute(EVENT_LOCK, params)
    cursor.execute(EVENT_LOOK if params["key"] is not None else EVENT_LOOK_NO_KEY, params)
    row = cursor.fetchone()
    return None if row is None else (int(row[0]), row[1], row[2], bool(row[3]))
