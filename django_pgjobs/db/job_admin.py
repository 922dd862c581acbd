"""What an operator does to jobs (the admin's actions, ``Job.objects``' ``retry()`` and
``cancel()``, the ``retry_jobs`` and ``cancel_jobs`` commands): cancel, retry now."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import IntegrityError

from django_pgjobs.db.cursor import Connection, atomic
from django_pgjobs.db.error_history import errors_kept, keep_newest
from django_pgjobs.db.held_slots import hold
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import DEPENDENCY, JOB, UNIQUE_ACTIVE_INDEX, by_id_is
from django_pgjobs.db.workflow_trigger import FINISHED_SQL
from django_pgjobs.states import JobStatus

# Cancel blocked, waiting, pending or running jobs; the lease bump rejects an in-flight
# result. (A cancelled workflow job's dependents: the trigger of db/workflow_trigger.py.)
# A running job's thread goes on until its worker sees the cancel (or the job checks
# context.is_cancelled()): its limit slot stays held (db/held_slots.py) under the
# run's lease, read from the locked row version.
JOB_CANCEL = f"""
WITH mine AS (
    SELECT id, status, lease, worker, queue, concurrency_key FROM {JOB}
     WHERE id = ANY(%(ids)s::bigint[])
       AND {by_id_is(JobStatus.BLOCKED, JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING)}
     ORDER BY id
       FOR NO KEY UPDATE
), cancelled AS (
    UPDATE {JOB} AS j
       SET status = '{JobStatus.CANCELLED}', lease = j.lease + 1, finished_at = now()
      FROM mine WHERE j.id = mine.id
    RETURNING j.id
), ran AS (
    SELECT * FROM mine WHERE status = '{JobStatus.RUNNING}'
), held AS (
    {hold("ran", "ran.lease")}
)
SELECT id FROM cancelled
"""
declare(
    "JOB_CANCEL",
    (JobStatus.BLOCKED, JobStatus.CANCELLED),
    (JobStatus.WAITING, JobStatus.CANCELLED),
    (JobStatus.PENDING, JobStatus.CANCELLED),
    (JobStatus.RUNNING, JobStatus.CANCELLED),
)

# The error history with the reaper's "refunded" marks cleared (see JOB_REAP_STALE).
_FORGIVEN = """(SELECT COALESCE(jsonb_agg(CASE WHEN e ? 'refunded' THEN e || '{"refunded": false}'
                                           ELSE e END ORDER BY i), '[]'::jsonb)
          FROM jsonb_array_elements(CASE WHEN jsonb_typeof(j.errors) = 'array'
                                         THEN j.errors ELSE '[]'::jsonb END)
               WITH ORDINALITY AS x(e, i))"""

# Retry now: dead, cancelled, or stuck running (stale heartbeat) -> pending, attempts
# reset, lease bumped so a stuck job's zombie is fenced; the error history stays.
# A dead or cancelled workflow job some of whose parents have not finished goes back
# to blocked instead: its counters are recounted from its edges and its parents'
# statuses now (RETRY_PARENT_LOCK holds them still), never kept from before, so what
# earlier statements retried counts whatever their order (a parent that finished
# without a result counts as finished: its child runs without it, as
# on_parent_failure="run" would; so does a parent whose row is gone). The
# trigger of db/workflow_trigger.py then resumes the dependents its failure cancelled,
# and puts back to blocked those released while it was failed. A stuck run is
# written off like the reaper's (back to pending: it was released, it ran): its limit
# slot stays held (db/held_slots.py) in case its worker was only frozen.
#
# unique_while (docs/reference/api.md): a dead or cancelled job that still carries a unique key
# must not take it back while another job holds it (blocked, waiting, pending or running), nor may
# two jobs of this statement take the same key. Such a job is skipped, like a
# second enqueue of the key: one row per skipped job, with the id of the job that
# holds (or in this call takes) the key; retried jobs come back with holder NULL.
# A stuck running job already holds its own key, so it is never skipped.
# Race-free with RETRY_KEY_LOCK first, in its own statement of the same transaction:
# two retries of the same key are serialised, and the second one's statement, whose
# snapshot is taken after the lock is granted, sees the first one's committed row.
JOB_RETRY_NOW = f"""
WITH mine AS (
    SELECT id, status, unique_key, lease, worker, queue, concurrency_key FROM {JOB}
     WHERE id = ANY(%(ids)s::bigint[])
       AND (status IN ('{JobStatus.DEAD}', '{JobStatus.CANCELLED}')
            OR (status = '{JobStatus.RUNNING}'
                AND heartbeat_at < now() - make_interval(secs => %(stale_after)s)))
     ORDER BY id
       FOR NO KEY UPDATE
), keyed AS (
    SELECT m.id,
           (SELECT h.id FROM {JOB} h
             WHERE h.unique_key = m.unique_key
               AND h.status IN ('{JobStatus.BLOCKED}', '{JobStatus.WAITING}',
                                '{JobStatus.PENDING}', '{JobStatus.RUNNING}')
             LIMIT 1) AS holder,
           min(m.id) OVER (PARTITION BY m.unique_key) AS first
      FROM mine m
     WHERE m.unique_key IS NOT NULL AND m.status <> '{JobStatus.RUNNING}'
), skipped AS (
    SELECT id, COALESCE(holder, first) AS holder FROM keyed
     WHERE holder IS NOT NULL OR id <> first
), counted AS (
    -- a workflow child's parents now: by the edges' primary key (child_id, position)
    SELECT m.id,
           count(*) FILTER (WHERE p.status NOT IN {FINISHED_SQL})::int AS waiting,
           count(*) FILTER (WHERE p.status IN ('{JobStatus.DEAD}', '{JobStatus.CANCELLED}'))::int
               AS failed
      FROM mine m
      JOIN {DEPENDENCY} e ON e.child_id = m.id
      LEFT JOIN {JOB} p ON p.id = e.parent_id
     WHERE m.status <> '{JobStatus.RUNNING}'
     GROUP BY m.id
), retried AS (
    UPDATE {JOB} AS j
       SET status = CASE WHEN COALESCE(c.waiting, j.waiting) > 0 THEN '{JobStatus.BLOCKED}'
                         ELSE '{JobStatus.PENDING}' END,
           waiting = COALESCE(c.waiting, j.waiting),
           failed_parents = COALESCE(c.failed, j.failed_parents),
           lease = j.lease + 1, attempts = 0, run_at = now(), finished_at = NULL,
           cancelled_by = NULL,
           -- the history stays (newest entries only); a fresh start forgives lost workers
           errors = {keep_newest(_FORGIVEN)}
      FROM mine LEFT JOIN counted c ON c.id = mine.id
     WHERE j.id = mine.id AND mine.id NOT IN (SELECT id FROM skipped)
    RETURNING j.id
), stuck AS (
    SELECT mine.* FROM mine WHERE mine.status = '{JobStatus.RUNNING}'
), held AS (
    {hold("stuck", "stuck.lease")}
)
SELECT id, NULL::bigint FROM retried
UNION ALL
SELECT id, holder FROM skipped
"""
declare(
    "JOB_RETRY_NOW",
    (JobStatus.DEAD, JobStatus.PENDING),
    (JobStatus.CANCELLED, JobStatus.PENDING),
    (JobStatus.RUNNING, JobStatus.PENDING),
    (JobStatus.DEAD, JobStatus.BLOCKED),
    (JobStatus.CANCELLED, JobStatus.BLOCKED),
)

# Lock, in one pass in id order, the selected jobs and the parents of the selected
# workflow jobs that have not completed (a completed parent never moves again), in
# its own statement before JOB_RETRY_NOW: that statement's snapshot, taken once these
# locks are granted, reads each parent's committed status, and nobody finishes or
# retries a parent until this transaction commits; whoever does then waits for it, and
# its trigger sees the child as this retry left it. One pass in id order: two retries
# of a parent and of its child wait for each other, never in a cycle; a completer
# holds its parent before it locks the children (higher ids), as this pass does.
RETRY_PARENT_LOCK = f"""
SELECT 1 FROM {JOB} j
 WHERE j.id = ANY (ARRAY(SELECT unnest(%(ids)s::bigint[])
                         UNION
                         SELECT e.parent_id FROM {DEPENDENCY} e
                          WHERE e.child_id = ANY (%(ids)s::bigint[])))
   AND j.status <> '{JobStatus.COMPLETED}'
 ORDER BY j.id
   FOR NO KEY UPDATE OF j
"""

# Serialise retries that could take the same unique_while key (see JOB_RETRY_NOW):
# one transaction-level advisory lock per key, in one order (no deadlock between two
# retries); nothing to lock, and no cost, for jobs without a key. Released at COMMIT.
RETRY_LOCK_SPACE = 0x706A6B79  # "pjky": the first key of the two-int advisory locks
RETRY_KEY_LOCK = f"""
SELECT pg_advisory_xact_lock({RETRY_LOCK_SPACE}, k.h)
  FROM (SELECT DISTINCT hashtext(unique_key) AS h FROM {JOB}
         WHERE id = ANY(%(ids)s::bigint[]) AND unique_key IS NOT NULL
           AND status IN ('{JobStatus.DEAD}', '{JobStatus.CANCELLED}')
         ORDER BY 1) AS k
"""


@dataclass(frozen=True)
class Retried:
    """What one retry statement did: the ids it put back to pending, and the ids it
    skipped because their unique_while key is held, each with the holder's id."""

    changed: set[int]
    held: dict[int, int]


def job_retry_now(connection: Connection, ids: Sequence[int], *, stale_after: float) -> Retried:
    """RETRY_KEY_LOCK, RETRY_PARENT_LOCK, then JOB_RETRY_NOW: UPDATE dead, cancelled or
    stuck jobs back to pending now behind their keys' advisory locks and their parents'
    row locks, rows in id order, skipping jobs whose unique_while key another job holds.

    Key locks and retry share one transaction (its own when the caller has none).
    A concurrent *enqueue* of the same key takes no lock: if it commits the key in
    between, the unique index refuses the update, and the statement is rerun once
    under a savepoint, when its fresh snapshot sees that job and skips ours.
    """
    params: dict[str, Any] = {"ids": list(ids), "stale_after": stale_after, "keep": errors_kept()}
    with atomic(connection):
        with connection.cursor() as cursor:
            cursor.execute(RETRY_KEY_LOCK, params)
            cursor.execute(RETRY_PARENT_LOCK, params)
        for attempt in range(3):
            try:
                with atomic(connection), connection.cursor() as cursor:
                    cursor.execute(JOB_RETRY_NOW, params)
                    rows = cursor.fetchall()
                break
            except (IntegrityError, psycopg.IntegrityError) as exc:
                diag = getattr(exc, "diag", None) or getattr(exc.__cause__, "diag", None)
                if getattr(diag, "constraint_name", None) != UNIQUE_ACTIVE_INDEX or attempt == 2:
                    raise
    return Retried(
        {r[0] for r in rows if r[1] is None}, {r[0]: r[1] for r in rows if r[1] is not None}
    )


def job_cancel(connection: Connection, ids: Sequence[int]) -> set[int]:
    """JOB_CANCEL: UPDATE unfinished jobs to cancelled, lease bumped, rows locked in id
    order; the ids of ``ids`` that were blocked, waiting, pending or running and are now
    cancelled."""
    with connection.cursor() as cursor:
        cursor.execute(JOB_CANCEL, {"ids": list(ids)})
        return {r[0] for r in cursor.fetchall()}
