"""The reaper's statement: reclaim running jobs whose heartbeat went stale."""

from __future__ import annotations

from typing import Any

from django_pgjobs.db.cursor import Connection
from django_pgjobs.db.error_history import error_entry, errors_kept, keep_newest
from django_pgjobs.db.held_slots import forget_gone, hold
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import JOB
from django_pgjobs.exceptions import WorkerLost
from django_pgjobs.states import JobStatus

_ERROR_ENTRY = error_entry(
    type="%(type)s::text",
    message="%(message)s::text",
    worker="j.worker",
    refunded="stale.refund",
    isolated="stale.suspect",
)

# How many times a job's worker was lost while it ran ALONE (a suspect in its own
# child process) with the attempt given back: entries marked "refunded" and
# "isolated" by the reaper (an admin retry clears the "refunded" marks).
_REFUNDED_ALONE = (
    "jsonb_array_length(jsonb_path_query_array("
    "errors, 'lax $[*] ? (@.refunded == true && @.isolated == true)'))"
)

# Reclaim running jobs whose heartbeat is stale. SKIP LOCKED: reapers on many
# hosts split the stale rows between them and never wait on a worker that is
# completing the same row right now; the lease bump fences the lost worker.
#
# A lost worker is not its jobs' fault, except for one of them perhaps (os._exit,
# a segfault, an OOM kill takes every neighbour in the process along): the attempt
# is given back (attempts - 1, back to pending) and the job becomes a suspect, which
# the next worker runs alone in a child process (worker/isolated.py): there a crash
# is charged to the crasher alone, as an attempt, and its neighbours lose nothing.
# Losing a job that was not a suspect (it ran among neighbours) is always given
# back, however often. Only losing a suspect, which ran alone, counts towards the
# "lost too often" backstop: after max_attempts such losses (bounded by the kept
# history) it is dead-lettered, so a job that takes down its worker even from its
# own process (kills its parent, say) still ends.
#
# Limit slots (db/held_slots.py): the lost worker may only be frozen, its thread
# still in the run; each reclaimed run keeps its slot, and the slots of workers
# gone for good are given back, in this same statement (which pg_cron runs too).
JOB_REAP_STALE = f"""
WITH stale AS (
    SELECT id, lease, worker, queue, concurrency_key, suspect,
           NOT suspect OR {_REFUNDED_ALONE} < least(max_attempts, %(keep)s) AS refund
      FROM {JOB}
     WHERE status = '{JobStatus.RUNNING}'
       AND heartbeat_at < now() - make_interval(secs => %(stale_after)s)
     ORDER BY heartbeat_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE {JOB} AS j
       SET lease = j.lease + 1,
           status = CASE WHEN stale.refund THEN '{JobStatus.PENDING}' ELSE '{JobStatus.DEAD}' END,
           attempts = CASE WHEN stale.refund THEN j.attempts - 1 ELSE j.attempts END,
           finished_at = CASE WHEN stale.refund THEN NULL ELSE now() END,
           run_at = now(),
           suspect = true,
           errors = {keep_newest(f"j.errors || {_ERROR_ENTRY}")},
           last_error = %(message)s || CASE WHEN stale.refund THEN '; the attempt was not counted'
                                            ELSE '; dead-lettered: its workers were lost too often'
                                       END
      FROM stale
     WHERE j.id = stale.id
    RETURNING j.id, j.task, j.status, j.attempts, j.worker
), held AS (
    {hold("stale", "stale.lease")}
), gone AS (
    {forget_gone()}
)
SELECT id, task, status, attempts, worker FROM reaped
"""
declare(
    "JOB_REAP_STALE", (JobStatus.RUNNING, JobStatus.PENDING), (JobStatus.RUNNING, JobStatus.DEAD)
)


def job_reap_stale(
    connection: Connection, *, stale_after: float, batch: int = 500
) -> list[tuple[int, str, str, int, str | None]]:
    """JOB_REAP_STALE: UPDATE one batch of running jobs of silent workers to pending or
    dead, ``FOR UPDATE SKIP LOCKED``, lease bumped; returns (id, task, new status,
    attempts, worker)."""
    with connection.cursor() as cursor:
        cursor.execute(JOB_REAP_STALE, reap_params(stale_after=stale_after, batch=batch))
        return [tuple(r) for r in cursor.fetchall()]


def reap_params(*, stale_after: float, batch: int, by: str = "") -> dict[str, Any]:
    """JOB_REAP_STALE's parameters; ``by``: who reclaims, when not a worker (pg_cron)."""
    message = (
        f"worker lost: no heartbeat for more than {stale_after:g}s; "
        f"the job was reclaimed{by} (it may have been running on a worker that was only slow)"
    )
    return {
        "stale_after": stale_after,
        "batch": batch,
        "message": message,
        "type": f"{WorkerLost.__module__}.{WorkerLost.__qualname__}",
        "keep": errors_kept(),
    }
