"""Helpers for testing your own jobs: run them synchronously in the test process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections

from . import outcomes, signals, sql
from .conf import get_settings
from .executor import execute


@dataclass(frozen=True)
class RanJob:
    """One job that ``run_jobs`` ran: its id, task, resulting status and return value."""

    id: int
    task: str
    status: str
    value: Any = None
    error: dict[str, Any] | None = None


_STATUS = {"completed": "completed", "retry": "pending", "dead": "dead", "fenced": "fenced"}


def run_jobs(queues: Sequence[str] | None = None, *, max_jobs: int | None = None,
             using: str | None = None) -> list[RanJob]:
    """Drain due jobs in this process (no threads), in claim order; return what ran.

    Sends the same signals as a worker (started, then succeeded/failed/dead).

    Works inside a ``TestCase`` transaction. A job that fails with attempts left
    is put back with its backoff delay, so it is not run again by the same call
    unless the delay has already passed.
    """
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    worker = "testing.run_jobs"
    ran: list[RanJob] = []
    while max_jobs is None or len(ran) < max_jobs:
        claimed = sql.claim(connection, worker=worker, queues=list(queues) if queues else None, n=1)
        if not claimed:
            break
        job = claimed[0]
        signals.send(signals.job_started, job_id=job.id, task=job.task, queue=job.queue,
                     attempt=job.attempt, lease=job.lease, worker=worker)
        outcome = execute(job, worker=worker, alias=alias)
        ours = outcomes.write(connection, job, outcome)
        outcomes.report(job, outcome, ours=ours, worker=worker)
        ran.append(RanJob(job.id, job.task, _STATUS[outcome.kind] if ours else "fenced",
                          outcome.value, outcome.error))
    return ran
