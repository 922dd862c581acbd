"""One claim, chosen by its arguments and run in one round trip: a plain claim
(``plain.py``, compiled by ``compiled.py``), from the claim front's bound and by
priority level or not, or the limited claim (``limited.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from django_pgjobs.claim.compiled import claim_statements
from django_pgjobs.claim.limited import job_claim_limited
from django_pgjobs.claim.plain import UNBOUNDED, job_claim, task_array
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.cursor import Connection


def claim(
    connection: Connection,
    *,
    worker: str,
    queues: Sequence[str] | None,
    n: int,
    tasks: Sequence[str] | None = None,
    limited: bool = False,
    since: datetime | None = None,
    levels: Sequence[int] | None = None,
) -> list[Claimed]:
    """Claim up to ``n`` due jobs (``queues=None``: every queue) in one round trip:
    the rows of ``Job.objects.claimable(queues, tasks=tasks, since=since)``, marked
    running.

    ``tasks``: claim only jobs of these tasks (the worker's registry; None: any).
    ``limited``: some queue in scope is paused or limited, or a known task has a
    concurrency key (see ``claimant.Claimant``): take the serialised limited claim.
    ``since``: only jobs with ``run_at >= since`` (``claim/front.py``; not the
    limited claim, which ranks every pending job of its queues).
    ``levels``: with ``since`` and named queues, only jobs of these priorities, each
    level's scan seeking to the bound (``JOB_CLAIM_LEVELS``; ``claim/front.py``).
    """
    if limited:
        if isinstance(connection, psycopg.Connection):
            raise TypeError("the limited claim runs on Django's connection only")
        return job_claim_limited(connection, worker=worker, queues=queues, n=n, tasks=tasks)
    params: dict[str, Any] = {"worker": worker, "n": n, "since": since or UNBOUNDED}
    statements = claim_statements(connection)
    known = tasks is not None
    if known:
        params["tasks"] = task_array(tuple(tasks or ()))
    if levels is not None and since is not None and queues is not None:
        statement = statements["JOB_CLAIM_LEVELS_KNOWN" if known else "JOB_CLAIM_LEVELS"]
        params["queues"] = list(queues)
        params["levels"] = list(levels)
    elif queues is None:
        statement = statements["JOB_CLAIM_ALL_KNOWN" if known else "JOB_CLAIM_ALL"]
    elif len(queues) == 1:
        statement = statements["JOB_CLAIM_ONE_QUEUE_KNOWN" if known else "JOB_CLAIM_ONE_QUEUE"]
        params["queue"] = queues[0]
    else:
        statement = statements["JOB_CLAIM_QUEUES_KNOWN" if known else "JOB_CLAIM_QUEUES"]
        params["queues"] = list(queues)
    return job_claim(connection, statement, params)
