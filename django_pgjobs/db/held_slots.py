"""Limit slots held by runs the queue has written off while their thread goes on
(a limit counts what really runs: see docs/explanation/guarantees.md).

Python cannot stop a thread. A run that timed out, was cancelled, was reclaimed
(the reaper, an admin retry of a stuck job) or was released at shutdown while it
went on leaves ``running`` at once, yet its thread (or a frozen worker's) may run
on. Each statement that writes off such a run records, **in the same statement**, a
row of ``django_pgjobs_heldslot`` for it: (job, lease of the run, worker, queue,
concurrency key). The limited claim counts these beside the running rows
(``claim/limited.py``), so the slot stays taken until one of:

* the run's worker has seen the run end (its thread returned, its task ended) and
  gives the slot back (``HELD_SLOT_FREE``, fenced by job, lease and worker: a later
  run of the same job never frees an earlier run's slot);
* the worker exits (``WORKER_DELETE``: its threads end with its process);
* the worker is gone: no fresh ``django_pgjobs_worker`` row, and the slot older than
  ``STALE_AFTER`` (the reaper's statement, ``forget_gone``).

Only runs that matter to a limit hold a slot: a job with a ``concurrency_key``, or of
a queue with ``max_running`` at the moment of the write-off. Ordinary jobs never
write a row here, so the fast path and mass reaps of unlimited queues cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from django_pgjobs.db.cursor import Connection
from django_pgjobs.db.tables import HELD_SLOT, QUEUE, WORKER


def hold(runs: str, lease: str) -> str:
    """A CTE body (``INSERT``) recording a held slot for each row of ``runs``: a
    relation with ``id``, ``worker``, ``queue`` and ``concurrency_key`` of the rows
    written off; ``lease``: the lease of their run (a column or a parameter). Rows of
    no limit are skipped. ``ON CONFLICT DO NOTHING``: one slot per run."""
    return f"""INSERT INTO {HELD_SLOT} (job_id, lease, worker, queue, concurrency_key, since)
    SELECT {runs}.id, {lease}, COALESCE({runs}.worker, ''), {runs}.queue,
           {runs}.concurrency_key, now()
      FROM {runs}
     WHERE {runs}.concurrency_key IS NOT NULL
        OR EXISTS (SELECT 1 FROM {QUEUE} q
                    WHERE q.name = {runs}.queue AND q.max_running IS NOT NULL)
    ON CONFLICT DO NOTHING"""


def forget_gone() -> str:
    """A CTE body (``DELETE``) giving back the slots of workers that are gone: no
    worker row seen within 2 x ``%(stale_after)s``, and the slot held for longer than
    ``%(stale_after)s``. So a frozen worker has 2 x STALE_AFTER in all to come back and
    say when its run ended, whether the slot was written when the reaper reclaimed the
    run (a new slot) or before the freeze (a timeout, a cancel: an old slot, which a
    test of the worker's silence alone would give back after STALE_AFTER). The reaper
    forgets a worker's row after the same 2 x STALE_AFTER. Part of the reaper's statement
    (JOB_REAP_STALE, which pg_cron runs too). SKIP LOCKED: reapers on many hosts never wait on each other."""
    return f"""DELETE FROM {HELD_SLOT} h
     WHERE (h.job_id, h.lease) IN (
        SELECT s.job_id, s.lease FROM {HELD_SLOT} s
         WHERE s.since < now() - make_interval(secs => %(stale_after)s)
           AND NOT EXISTS (SELECT 1 FROM {WORKER} w
                            WHERE w.id = s.worker
                              AND w.last_seen > now() - make_interval(secs => 2 * %(stale_after)s))
           FOR UPDATE SKIP LOCKED)"""


# A worker gives back the slots of runs it has seen end: fenced by job, lease and
# worker, so it frees only the slot of that very run. Rows are locked through the
# primary key; a slot already gone (never written, or forgotten) is no error.
HELD_SLOT_FREE = f"""
DELETE FROM {HELD_SLOT} h
 USING unnest(%(ids)s::bigint[], %(leases)s::bigint[]) AS f(id, lease)
 WHERE h.job_id = f.id AND h.lease = f.lease AND h.worker = %(worker)s
"""


def held_slot_free(connection: Connection, *, worker: str, runs: Sequence[tuple[int, int]]) -> int:
    """HELD_SLOT_FREE: DELETE the held slots of ``(job id, lease)`` runs of ``worker``,
    by primary key, fenced by job, lease and worker; how many there were."""
    if not runs:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            HELD_SLOT_FREE,
            {"ids": [r[0] for r in runs], "leases": [r[1] for r in runs], "worker": worker},
        )
        return int(cursor.rowcount)
