"""Helpers for testing your own jobs: run them synchronously in the test process."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import outcomes, signals, sql
from .conf import get_settings
from .exceptions import PgJobsError
from .executor import Outcome, execute


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

    When the connection fails while writing an outcome (the write may or may not
    have committed), it reconnects and redoes the write once: the outcome writes
    recognise their own committed write, so the job is reported exactly once. If
    the redo fails too (or the call runs inside a transaction, where reconnecting
    is impossible) it raises ``PgJobsError`` naming the job.
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
        ours = _write(connection, job, outcome)
        outcomes.report(job, outcome, ours=ours, worker=worker)
        ran.append(RanJob(job.id, job.task, _STATUS[outcome.kind] if ours else "fenced",
                          outcome.value, outcome.error))
    return ran


_CONNECTION_ERRORS = (OperationalError, InterfaceError)


def _write(connection: BaseDatabaseWrapper, job: sql.Claimed, outcome: Outcome) -> bool:
    """Write the outcome; on a connection error reconnect and redo it once (the
    writes are idempotent and recognise their own earlier committed run)."""
    try:
        return outcomes.write(connection, job, outcome)
    except _CONNECTION_ERRORS as exc:
        first = exc
    what = f"the {outcome.kind} outcome of job {job.id} ({job.task})"
    if connection.in_atomic_block:
        raise PgJobsError(
            f"run_jobs: {what} could not be written: the connection failed ({first}) "
            "inside a transaction, so it cannot be redone; the job's row may or may not "
            "have been updated") from first
    with contextlib.suppress(DatabaseError):
        connection.close()
    try:
        return outcomes.write(connection, job, outcome)
    except _CONNECTION_ERRORS as again:
        raise PgJobsError(
            f"run_jobs: {what} could not be written: the connection failed ({first}) "
            f"and the redo after reconnecting failed too ({again}); the job's row may "
            "or may not have been updated") from again
