"""The chunk's claim: more due jobs of one task in one queue, for a chunk the worker
is filling (``worker/chunks.py``).

It is the plain one-queue claim restricted to that one task
(``JOB_CLAIM_ONE_QUEUE_KNOWN`` with a one-name task list, compiled from
``Job.objects.claimable(queue, tasks=[task])``): ``FOR UPDATE SKIP LOCKED`` over the
claim index in its order, the rows marked running (attempt, lease, worker) by the
same ``UPDATE … RETURNING`` as every plain claim, so a chunk's jobs are claimed,
fenced and reaped exactly as jobs claimed one by one. No bound on ``run_at``
(the claim front is the claim loop's): the scan starts at the queue's first entry
and filters by task, so jobs of other tasks ahead of the task's own in that queue
are stepped over in the index, without a lock. It takes no limit into account: the
worker fills a chunk only in a queue without ``max_running``, ``rate`` or a pause
(``worker/chunks.py`` reads the claimant's queue limits), and a chunked task has
no concurrency key. Beside limited claims (a worker with a limited queue or a
task with a concurrency key), it waits for their lock, as they do.
"""

from __future__ import annotations

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.claim.compiled import claim_statements
from django_pgjobs.claim.limited import FLOW_LOCK
from django_pgjobs.claim.plain import UNBOUNDED, job_claim, task_array
from django_pgjobs.claim.rows import Claimed


def claim_chunk(
    connection: BaseDatabaseWrapper,
    *,
    worker: str,
    queue: str,
    task: str,
    n: int,
    serialised: bool,
) -> list[Claimed]:
    """Claim up to ``n`` due jobs of ``task`` in ``queue``: one statement, or with
    ``serialised`` (the worker's claims are limited ones) behind the limited claims'
    ``FLOW_LOCK``, in one short transaction. The limited claim ranks the first rows
    of a queue before it locks them and counts on no claim taking rows meanwhile:
    a chunk's claim beside it, unserialised, left it with none of the rows it had
    ranked and no job claimed while the queue was full of due jobs."""
    statement = claim_statements(connection)["JOB_CLAIM_ONE_QUEUE_KNOWN"]
    params = {
        "worker": worker,
        "n": n,
        "since": UNBOUNDED,
        "queue": queue,
        "tasks": task_array((task,)),
    }
    if not serialised:
        return job_claim(connection, statement, params)
    with transaction.atomic(using=connection.alias, savepoint=False):
        with connection.cursor() as cursor:
            cursor.execute(FLOW_LOCK)
        return job_claim(connection, statement, params)
