"""Run a chunk: the claimed jobs of one chunked task in one call of its handler, and
each job's own ``Outcome`` from what the call did (``chunking.result_of``).

Each job is prepared as a job run alone is (its definition, its stored arguments,
its idempotency short-circuit, a workflow node's parents): a job that must not run
gets its own outcome and stays out of the call. The call's exception is every
called job's failure, charged once to each (retried or dead-lettered by its own
attempts); a transaction left open fails every called job, as it fails a job run
alone. The outcomes are written by the completer, each fenced by its own job's
lease, and records the call (``Claimed.chunk_run``, one new id a call) on each
called job's row, for the job page (``jobs/chunk_schema.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from django_pgjobs.claim.rows import Claimed
from django_pgjobs.jobs.chunking import ChunkItem, result_of
from django_pgjobs.jobs.context import JobContext
from django_pgjobs.jobs.definition import JobDefinition
from django_pgjobs.support import tracing
from django_pgjobs.worker import job_connection
from django_pgjobs.worker.executor import (
    call_handler,
    failure,
    finish,
    last_resort,
    left_open_error,
    prepare,
)
from django_pgjobs.worker.outcomes import Outcome


def execute_chunk(
    members: Sequence[tuple[Claimed, JobContext]],
    *,
    worker: str | None,
    alias: str,
    tracer: Any = tracing.LOOK_UP,
) -> list[Outcome]:
    """Run ``members`` (claims of one chunked task, with their contexts) in one call
    on this thread; their outcomes, in order. Never raises."""
    started_at = time.time()
    outcomes: list[Outcome | None] = [None] * len(members)
    called: list[int] = []  # positions of the jobs handed to the call
    items: list[ChunkItem] = []
    definition: JobDefinition | None = None
    for i, (claimed, context) in enumerate(members):
        try:
            prepared = prepare(claimed, worker, alias, started_at)
        except BaseException as exc:  # noqa: BLE001 - this job's failure alone
            outcomes[i] = last_resort(claimed, exc, worker)
            continue
        if isinstance(prepared, Outcome):  # it must not run (or need not)
            outcomes[i] = prepared
            continue
        definition, args, kwargs, parents = prepared
        if parents is not None:
            context.parent_results = parents
        given = context if definition.takes_context else None
        items.append(ChunkItem(claimed.id, args, kwargs, given))
        called.append(i)
    if definition is not None and called:
        run = str(uuid.uuid4())
        for i in called:
            members[i][0].chunk_run = run
        first_claimed, first_context = members[called[0]]
        try:
            # one span for the call, in the first job's trace
            with tracing.job_span(first_claimed, tracer):
                value = call_handler(definition, first_context, [items], {})
        except BaseException as exc:  # noqa: BLE001 - the call's failure is each job's
            if job_connection.left_open(alias):
                job_connection.close(alias)
            for i in called:
                outcomes[i] = failure(definition, members[i][0], exc, worker, started_at=started_at)
        else:
            _read(definition, members, called, value, outcomes, worker, alias, started_at)
    return [
        outcome if outcome is not None else last_resort(claimed, _unreached(claimed), worker)
        for outcome, (claimed, _) in zip(outcomes, members, strict=True)
    ]


def _read(
    definition: JobDefinition,
    members: Sequence[tuple[Claimed, JobContext]],
    called: list[int],
    value: Any,
    outcomes: list[Outcome | None],
    worker: str | None,
    alias: str,
    started_at: float,
) -> None:
    """The call returned ``value``: each called job's outcome from its share of it."""
    if job_connection.left_open(alias):
        job_connection.close(alias)  # the server rolls back what it wrote since BEGIN
        for i in called:
            claimed = members[i][0]
            outcomes[i] = failure(
                definition, claimed, left_open_error(claimed), worker, started_at=started_at
            )
        return
    ids = frozenset(members[i][0].id for i in called)
    for i in called:
        claimed = members[i][0]
        try:
            mine = result_of(value, claimed.id, ids, claimed.task)
        except BaseException as exc:  # noqa: BLE001 - the exception mapped to this job
            outcomes[i] = failure(definition, claimed, exc, worker, started_at=started_at)
            continue
        outcomes[i] = finish(definition, claimed, mine, worker, started_at)


def _unreached(claimed: Claimed) -> RuntimeError:
    return RuntimeError(f"job {claimed.id} ({claimed.task}) got no outcome from its chunk")
