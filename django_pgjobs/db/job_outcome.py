"""The lease-checked writes about a claimed job: heartbeat, complete, retry, timed out,
dead letter, release — each fenced by the lease its claim handed out — and the
stored result of an idempotency key."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.db.cursor import Connection, hot_cursor, int_array, json_value, text_array
from django_pgjobs.db.error_history import dead_letter, error_params, keep_newest
from django_pgjobs.db.held_slots import hold
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import ASYNC_COMMIT, JOB, RESULT, by_id_is
from django_pgjobs.states import JobStatus


def _lock_ours(source: str) -> str:
    """The running rows of ``source`` (id, lease) that are still ours, locked in id
    order: the shared first step of the heartbeat and the redo completion, so the
    two can never wait on each other in a cycle."""
    # One probe of the primary key per id, in id order (the nested loop keeps the
    # sorted outer's order): a join left to the planner hash-joined a sequential
    # scan of every running row, a cost that grows with the running jobs and slowed
    # the whole drain (tests/db/test_perf_plans.py).
    return f"""SELECT l.id FROM (SELECT id, lease FROM {source} ORDER BY id) o
     CROSS JOIN LATERAL (
        SELECT j.id FROM {JOB} j
         WHERE j.id = o.id AND j.lease = o.lease
           AND {by_id_is(JobStatus.RUNNING, column="j.status")}
           FOR NO KEY UPDATE OF j
     ) l"""


_TOLD = (
    "f AS (\n    SELECT * FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[]) AS f(id, lease)\n)"
)


def _beat(source: str) -> str:
    """The CTEs that refresh ``heartbeat_at`` of the rows of ``source`` (id, lease) that
    are still ours, locked in id order."""
    return f"""mine AS (
    {_lock_ours(source)}
), touched AS (
    -- asynchronous commit, as for claims: a lost heartbeat only ages the row
    UPDATE {JOB} AS j SET heartbeat_at = now() FROM {ASYNC_COMMIT}
     WHERE j.id = ANY(ARRAY(SELECT id FROM mine)) RETURNING j.id
)"""


def _lost(columns: str) -> str:
    """``columns`` of the told (id, lease) whose lease is no longer ours."""
    return f"""-- a scalar subquery: one probe of the primary key per id (a join was planned as
-- a sequential scan of the table once it held thousands of running jobs)
SELECT {columns} FROM f
 WHERE (SELECT j.lease FROM {JOB} j WHERE j.id = f.id) IS DISTINCT FROM f.lease"""


# Refresh the heartbeat of all of a worker's in-flight jobs in one statement.
# Rows are locked in id order (see module docstring). Returns the ids whose lease
# is no longer ours: reclaimed, cancelled or retried by someone else.
JOB_HEARTBEAT = f"""
WITH {_TOLD}, {_beat("f")}
{_lost("f.id")}
"""

# The heartbeat process's beat (django_pgjobs/pulse.py), made only while the worker is
# late (a job holds its GIL): JOB_HEARTBEAT for the jobs the worker told it of, and
# every other running row claimed by this worker (``worker`` = its id) under a lease
# it was not told of: a claim that committed while the GIL was held, whose reply the
# claimer could not read yet, so neither the worker's in-flight table nor this process
# knew the rows, and nothing refreshed them (reaped from a live worker).
# Such a row runs on this worker as soon as it can read the reply; until then it is
# kept alive like the others. Returns (id, lease, adopted): the told leases no longer
# ours (adopted false) and the rows adopted (true), beaten from now on. Read through
# the running index (as many rows as jobs in flight); the process beats at most once
# per interval, and only while the worker is late.
JOB_HEARTBEAT_PULSE = f"""
WITH {_TOLD}, adopted AS (
    SELECT j.id, j.lease FROM {JOB} j
     WHERE j.status = '{JobStatus.RUNNING}' AND j.worker = %(worker)s
       AND NOT EXISTS (SELECT 1 FROM f WHERE f.id = j.id AND f.lease = j.lease)
), beaten AS (
    SELECT id, lease FROM f UNION ALL SELECT id, lease FROM adopted
), {_beat("beaten")}
{_lost("f.id, f.lease, false")}
UNION ALL
SELECT id, lease, true FROM adopted
"""


# Complete a batch of jobs and store their results in the same statement (so in
# the same transaction); fenced by lease and status. A result row is written when
# there is a value or an idempotency key to protect. JobResult has no FK to the
# job, so this insert takes no lock on job rows.
#
# Both forms lock their rows first, ``ORDER BY id FOR NO KEY UPDATE`` (the step the
# heartbeat shares): the one lock order of every statement that waits for job rows
# (docs/explanation/how-a-claim-works.md, "One lock order"). The hot form once
# updated through a join on ``d`` and relied on the plan to meet the rows in id
# order; on a small or freshly analysed table PostgreSQL chose a hash join over a
# sequential scan, locked in the heap's order, and deadlocked with cancels and
# heartbeats (tests/db/test_lock_order.py). The explicit lock costs one more WAL
# record per row, a small price for a lock order that holds whatever the plan.
def _complete_items(*, chunk: bool = False) -> str:
    """The CTEs that complete the told rows still ours (``done``); with ``chunk``, each
    row also records the chunk run it ran in (``Job.chunk_run``, jobs/chunk_schema.py)."""
    told = "%(ids)s::bigint[], %(leases)s::bigint[], %(values)s::jsonb[]"
    columns = "id, lease, value"
    recorded = ""
    if chunk:
        told += ", %(runs)s::uuid[]"
        columns += ", chunk_run"
        recorded = ", chunk_run = d.chunk_run"
    return f"""d AS (
    SELECT * FROM unnest({told})
        AS d({columns})
), mine AS (
    {_lock_ours("d")}
), done AS (
    UPDATE {JOB} AS j SET status = '{JobStatus.COMPLETED}', finished_at = now(), suspect = false{recorded}
      FROM d WHERE j.id = ANY(ARRAY(SELECT id FROM mine)) AND d.id = j.id
    RETURNING j.id, j.idempotency_key, d.value
)"""


_COMPLETE_ITEMS = _complete_items()

# A completion also clears ``suspect`` (db/reap.py): the run ended normally.
#
# Both forms end the same: ``done`` returns (id, idempotency_key, value) of the rows
# completed, and their results are stored.
_STORE_RESULTS = f"""stored AS (
    INSERT INTO {RESULT} (job_id, idempotency_key, value, created_at)
    SELECT done.id, done.idempotency_key, done.value, now()
      FROM done
     WHERE done.value IS NOT NULL OR done.idempotency_key IS NOT NULL
    ON CONFLICT DO NOTHING
)"""

# The completer's first try of a batch, the hot one: it cannot meet a write of its
# own that committed earlier, so it does not look for one (a probe per row saved).
JOB_COMPLETE_MANY = f"""
WITH {_COMPLETE_ITEMS}, {_STORE_RESULTS}
SELECT id FROM done
"""
declare("JOB_COMPLETE_MANY", (JobStatus.RUNNING, JobStatus.COMPLETED))


# The redo form, for every other caller (a batch retried after an error, one row
# at a time, an atomic job's own transaction, run_jobs): also answers the rows an
# earlier, committed run of this very write completed.
def _complete_redo(items: str) -> str:
    return f"""
WITH {items}, {_STORE_RESULTS}
SELECT id FROM done
UNION ALL
-- Already completed under OUR lease: an earlier run of this very write committed
-- (its reply was lost, or the batch was retried after an error). The statement's
-- snapshot predates ``done``, so a row is never counted twice.
SELECT j.id FROM {JOB} j JOIN d ON j.id = d.id AND j.lease = d.lease
 WHERE j.id = ANY(%(ids)s::bigint[]) AND {by_id_is(JobStatus.COMPLETED, column="j.status")}
"""


JOB_COMPLETE_MANY_REDO = _complete_redo(_COMPLETE_ITEMS)
declare("JOB_COMPLETE_MANY_REDO", (JobStatus.RUNNING, JobStatus.COMPLETED))

# The completion of jobs that ran in a chunk (worker/chunk_call.py): the redo form, each
# row also recording its chunk run. A statement of its own, so a plain job's completion
# (the hot form above) stays as it is; always the redo form, as a chunk's completions
# are a small share of a batch's.
JOB_COMPLETE_CHUNK = _complete_redo(_complete_items(chunk=True))
declare("JOB_COMPLETE_CHUNK", (JobStatus.RUNNING, JobStatus.COMPLETED))


# Recognising our own earlier committed write (its reply was lost, the write is
# redone): every error entry a worker writes is unique (its worker id and an
# ``at`` time taken client-side with microseconds), so "the row's errors contain
# our entry" means "this very write committed", even after the job was claimed
# again by another worker (the lease moved on). Matched by primary key and
# containment, so it stays cheap. ``%(mark)s`` is NULL for an entry without
# ``at``: then only the same-lease check recognises it (``by_lease``; a write that
# bumps the lease can never match its old lease again, so it has the entry only).
# Corner case: entries are trimmed to the MAX_ERRORS_KEPT newest; ours is the
# newest when written, so it is only lost if that many later failures were
# recorded before the redo, and then the redo is reported as fenced (it changes
# nothing either way).
def _ours_already(statuses: str, *, by_lease: bool = True) -> str:
    entry = "errors @> %(mark)s::jsonb"
    if not by_lease:
        return entry
    return f"""(lease = %(lease)s AND status IN ({statuses}) AND last_error = %(last_error)s)
        OR {entry}"""


# The end of every failed-attempt write: our error entry appended (the history kept
# bounded), last_error set, the chunk run it ran in recorded (a run alone, NULL, keeps
# the last one: jobs/chunk_schema.py), on the running row that is still ours.
_RECORD_OURS = f"""chunk_run = COALESCE(%(chunk_run)s::uuid, chunk_run),
           errors = {keep_newest("errors || %(error)s::jsonb")},
           last_error = %(last_error)s
     WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(JobStatus.RUNNING)}"""


# A failed attempt: back to pending after the backoff delay, or dead. Fenced by the
# lease we claimed; returns the status our write gave the row. Guarded by
# attempts: a row whose attempts are used up is dead-lettered instead, whatever
# the caller decided, so no row is ever pending with attempts = max_attempts (its
# next claim would violate attempts_in_bounds and fail the whole claim statement).
# The second SELECT recognises our own earlier committed write (see _ours_already):
# a redone write reports that status once more instead of "fenced". The
# statement's snapshot predates ``upd``, so a row is never returned twice.
#
# timed_out=True: give up on a run that exceeded its timeout. The lease is also
# bumped (anything the abandoned run writes later is fenced), and %(retry)s says
# whether the job may be retried at all; the lease bump means a redo of this write
# can only recognise its committed write by its error entry. The abandoned run's
# thread goes on: its limit slot stays held (db/held_slots.py) until the worker sees
# it end; a redo inserts no second slot (its UPDATE matches no row).
#
# ``suspect`` (db/reap.py) is set to %(suspect)s: false after a run that failed
# normally (it ran to an outcome), true when the failed run is a suspect's isolated
# run that killed its own process (worker/isolated.py) or was given up on after its
# timeout (it has not shown that it ends well): it runs alone again.
def _failed_attempt(*, timed_out: bool) -> str:
    """JOB_RETRY (``timed_out=False``) or JOB_TIMED_OUT."""
    retry = f"attempts < max_attempts{' AND %(retry)s' if timed_out else ''}"
    redo_retry = f"%(attempt)s::int < max_attempts{' AND %(retry)s' if timed_out else ''}"
    returning = "id, status, worker, queue, concurrency_key" if timed_out else "status"
    held = (
        f"""), held AS (
    {hold("upd", "%(lease)s::bigint")}
"""
        if timed_out
        else ""
    )
    return f"""
WITH upd AS (
    UPDATE {JOB}
       SET {"lease = lease + 1, " if timed_out else ""}status = CASE WHEN {retry} THEN '{JobStatus.PENDING}' ELSE '{JobStatus.DEAD}' END,
           finished_at = CASE WHEN {retry} THEN NULL ELSE now() END,
           run_at = now() + make_interval(secs => %(delay)s),
           suspect = %(suspect)s,
           {_RECORD_OURS}
    RETURNING {returning}
{held})
SELECT status FROM upd
UNION ALL
SELECT CASE WHEN lease = %(lease)s AND status <> '{JobStatus.RUNNING}' THEN status
            WHEN {redo_retry} THEN '{JobStatus.PENDING}'
            ELSE '{JobStatus.DEAD}' END
  FROM {JOB}
 WHERE id = %(id)s
   AND ({_ours_already(f"'{JobStatus.PENDING}', '{JobStatus.DEAD}'", by_lease=not timed_out)})
"""


JOB_RETRY = _failed_attempt(timed_out=False)
declare("JOB_RETRY", (JobStatus.RUNNING, JobStatus.PENDING), (JobStatus.RUNNING, JobStatus.DEAD))
JOB_TIMED_OUT = _failed_attempt(timed_out=True)
declare(
    "JOB_TIMED_OUT", (JobStatus.RUNNING, JobStatus.PENDING), (JobStatus.RUNNING, JobStatus.DEAD)
)

# A failed attempt with none left (or discard_on / unknown task): dead letter.
# Same recognition of our own earlier committed write as JOB_RETRY.
JOB_DEAD = f"""
WITH upd AS (
    UPDATE {JOB}
       SET status = '{JobStatus.DEAD}',
           finished_at = now(),
           {_RECORD_OURS}
    RETURNING id
)
SELECT id FROM upd
UNION ALL
SELECT id FROM {JOB}
 WHERE id = %(id)s AND ({_ours_already(f"'{JobStatus.DEAD}'")})
"""
declare("JOB_DEAD", (JobStatus.RUNNING, JobStatus.DEAD))

# A claim statement failed with a data error (a CHECK violation): the only row
# state that makes a claim fail is a pending row whose attempts are used up
# (written by an older version, or by hand). Dead-letter those rows, each with a
# clear error, so the queue moves again. SKIP LOCKED: never waits on a worker.
JOB_DEAD_EXHAUSTED = f"""
WITH bad AS (
    SELECT id FROM {JOB}
     WHERE status = '{JobStatus.PENDING}' AND attempts >= max_attempts
     ORDER BY id
     LIMIT 1000
       FOR UPDATE SKIP LOCKED
)
{dead_letter("bad", type="'django_pgjobs.exceptions.PgJobsError'", message="%(message)s::text", worker="%(worker)s::text", last_error="%(message)s")}
"""
declare("JOB_DEAD_EXHAUSTED", (JobStatus.PENDING, JobStatus.DEAD))

# Graceful shutdown: hand an unfinished job back without counting the attempt.
# %(still_running)s: its run was still going when SHUTDOWN_TIMEOUT ran out; its
# limit slot stays held (db/held_slots.py) until the worker exits, which ends the
# thread (WORKER_DELETE gives the slot back).
# What a release writes (one job or many): back to pending, due now, the attempt not
# counted.
_RELEASED = f"status = '{JobStatus.PENDING}', attempts = attempts - 1, run_at = now()"

JOB_RELEASE = f"""
WITH upd AS (
    UPDATE {JOB}
       SET {_RELEASED}
     WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(JobStatus.RUNNING)}
    RETURNING id, worker, queue, concurrency_key
), ran AS (
    SELECT * FROM upd WHERE %(still_running)s
), held AS (
    {hold("ran", "%(lease)s::bigint")}
)
SELECT id FROM upd
UNION ALL
-- Already given back under OUR lease: an earlier run of this very write committed
-- (its reply was lost; the completer redoes it). Every claim moves the lease on, so
-- a pending row still at our lease is one we gave back. The statement's snapshot
-- predates ``upd``, so a row is never returned twice.
SELECT id FROM {JOB}
 WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(JobStatus.PENDING)}
"""
declare("JOB_RELEASE", (JobStatus.RUNNING, JobStatus.PENDING))

# Graceful shutdown, the jobs a worker claimed ahead and never started (up to
# ``--batch`` of them): all handed back in one statement, attempts not counted, as
# JOB_RELEASE does one at a time; none of them holds a limit slot. Locked in id
# order first (the heartbeat's step: the one lock order). Returns the ids released;
# a told (id, lease) missing from them was no longer ours.
JOB_RELEASE_MANY = f"""
WITH {_TOLD}, mine AS (
    {_lock_ours("f")}
)
UPDATE {JOB}
   SET {_RELEASED}
 WHERE id = ANY(ARRAY(SELECT id FROM mine))
RETURNING id
"""
declare("JOB_RELEASE_MANY", (JobStatus.RUNNING, JobStatus.PENDING))

# A stored result for an idempotency key: the job already ran to completion once.
RESULT_BY_KEY = f"SELECT value FROM {RESULT} WHERE idempotency_key = %s"


def encode_result(value: Any) -> str | None:
    """The JSON text stored for a return value (None: nothing to store). Raises
    ValueError/RecursionError for values json cannot encode: callers run it in the
    job's own thread so only that job fails."""
    return None if value is None else json.dumps(value, allow_nan=False)


class Encoded(str):
    """A return value already encoded with ``encode_result`` (by the job thread)."""


def job_heartbeat(connection: Connection, items: Sequence[tuple[int, int]]) -> set[int]:
    """JOB_HEARTBEAT: UPDATE ``heartbeat_at`` of ``(id, lease)`` items, rows locked in id
    order, lease-fenced; returns the ids whose lease is no longer ours."""
    if not items:
        return set()
    with hot_cursor(connection) as cursor:
        cursor.execute(
            JOB_HEARTBEAT, {"ids": [i[0] for i in items], "leases": [i[1] for i in items]}
        )
        return {row[0] for row in cursor.fetchall()}


def job_complete_many(
    connection: Connection,
    items: Sequence[tuple[Any, ...]],
    *,
    redo: bool = True,
    chunk: bool = False,
) -> set[int]:
    """JOB_COMPLETE_MANY_REDO (or with ``redo=False``, only for a first try that cannot
    have run before, JOB_COMPLETE_MANY): complete ``(id, lease, return value)`` items;
    returns the ids that were still ours (with ``redo``, including those an earlier,
    committed run of the same write completed). Values of type ``Encoded`` are stored
    as they are. ``chunk``: items ``(id, lease, return value, chunk run)`` of jobs that
    ran in a chunk, each recording its chunk run (JOB_COMPLETE_CHUNK, a redo form)."""
    items = sorted(items, key=lambda i: i[0])  # lock order: by id
    params = {
        "ids": int_array(i[0] for i in items),
        "leases": int_array(i[1] for i in items),
        "values": text_array(
            i[2] if isinstance(i[2], Encoded) else encode_result(i[2]) for i in items
        ),
    }
    statement = JOB_COMPLETE_MANY_REDO if redo else JOB_COMPLETE_MANY
    if chunk:
        params["runs"] = text_array(i[3] for i in items)
        statement = JOB_COMPLETE_CHUNK
    with hot_cursor(connection) as cursor:
        cursor.execute(statement, params)
        return {row[0] for row in cursor.fetchall()}


def job_retry(
    connection: Connection,
    *,
    id: int,
    lease: int,
    delay: float,
    error: dict[str, Any],
    suspect: bool = False,
) -> str | None:
    """JOB_RETRY: UPDATE a failed attempt to pending later or dead, the one row by
    primary key, lease-fenced; the status it gave the row ("pending", or "dead" when the
    attempts guard dead-lettered it), or None when the lease was no longer ours.
    ``suspect``: the run killed its own process; it stays a suspect."""
    params = {"id": id, "lease": lease, "delay": delay, "suspect": suspect}
    return _status(connection, JOB_RETRY, params, error)


def job_timed_out(
    connection: Connection,
    *,
    id: int,
    lease: int,
    delay: float,
    error: dict[str, Any],
    retry: bool,
    suspect: bool = False,
) -> str | None:
    """JOB_TIMED_OUT: UPDATE a run past its timeout, the one row, lease-fenced and bumped;
    the new status, or None if not ours. The arguments of ``job_retry``, and ``retry``:
    whether the job may run again at all."""
    params = {"id": id, "lease": lease, "retry": retry, "delay": delay, "suspect": suspect}
    return _status(connection, JOB_TIMED_OUT, params, error)


def _status(
    connection: Connection, statement: str, params: dict[str, Any], error: dict[str, Any]
) -> str | None:
    with hot_cursor(connection) as cursor:
        cursor.execute(statement, params | error_params(error))
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def job_dead(connection: Connection, *, id: int, lease: int, error: dict[str, Any]) -> bool:
    """JOB_DEAD: UPDATE a claimed job to dead, the one row, lease-fenced; False when the
    lease was no longer ours."""
    return _fenced(connection, JOB_DEAD, {"id": id, "lease": lease} | error_params(error))


def job_release(
    connection: Connection, *, id: int, lease: int, still_running: bool = False
) -> bool:
    """JOB_RELEASE: UPDATE a claimed job back to pending, uncounted, the one row,
    lease-fenced: the give-back of a claim, a shutdown, a lost run (``still_running``:
    its run goes on until the worker exits); False when it was no longer ours."""
    params = {"id": id, "lease": lease, "still_running": still_running}
    return _fenced(connection, JOB_RELEASE, params)


def job_release_many(connection: Connection, told: Sequence[tuple[int, int]]) -> set[int]:
    """JOB_RELEASE_MANY: UPDATE claimed jobs that never started back to pending,
    uncounted, rows locked in id order, lease-fenced; the ids released."""
    params = {
        "ids": int_array(job_id for job_id, _ in told),
        "leases": int_array(lease for _, lease in told),
    }
    with hot_cursor(connection) as cursor:
        cursor.execute(JOB_RELEASE_MANY, params)
        return {int(row[0]) for row in cursor.fetchall()}


def _fenced(connection: Connection, statement: str, params: dict[str, Any]) -> bool:
    with hot_cursor(connection) as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone() is not None


def job_dead_exhausted(connection: BaseDatabaseWrapper, *, worker: str) -> list[tuple[int, str]]:
    """JOB_DEAD_EXHAUSTED: UPDATE pending rows whose attempts are used up (they fail
    every claim) to dead, ``FOR UPDATE SKIP LOCKED``; their (id, task)."""
    message = (
        "pending with its attempts used up, which would fail every claim of its "
        "queue; dead-lettered"
    )
    with connection.cursor() as cursor:
        cursor.execute(JOB_DEAD_EXHAUSTED, {"message": message, "worker": worker})
        return [(r[0], r[1]) for r in cursor.fetchall()]


def result_by_key(connection: BaseDatabaseWrapper, key: str) -> tuple[bool, Any]:
    """RESULT_BY_KEY: ``(found, value)`` of the stored result for an idempotency key."""
    with connection.cursor() as cursor:
        cursor.execute(RESULT_BY_KEY, [key])
        row = cursor.fetchone()
    return (False, None) if row is None else (True, json_value(row[0]))
