"""Helpers for testing your own jobs: run them synchronously in the test process."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_pgjobs import signals
from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import job_advance_waiting, job_wake_due
from django_pgjobs.exceptions import PgJobsError
from django_pgjobs.states import JobStatus
from django_pgjobs.support.safetext import printable
from django_pgjobs.worker import outcomes
from django_pgjobs.worker.executor import execute
from django_pgjobs.worker.outcomes import Outcome

logger = logging.getLogger("django_pgjobs")


@dataclass(frozen=True)
class RanJob:
    """One job that ``run_jobs`` ran: its id, task, resulting status and return value."""

    id: int
    task: str
    status: str
    value: Any = None
    error: dict[str, Any] | None = None


_STATUS = {
    "completed": "completed",
    "retry": "pending",
    "dead": "dead",
    "fenced": "fenced",
    "released": "pending",
    "waiting": "waiting",
}


def run_jobs(
    queues: Sequence[str] | None = None,
    *,
    max_jobs: int | None = None,
    using: str | None = None,
    advance: timedelta | None = None,
) -> list[RanJob]:
    """Drain due jobs in this process (no threads), in claim order; return what ran.

    Claims like a worker (``claim.claimant.Claimant``): a paused queue is not drained, and
    ``max_running``, ``rate`` and concurrency keys hold. A job of a task this process
    has not registered is left pending, untouched (a worker leaves it to a worker
    that knows the task). Sends the same signals as a worker (started, then
    succeeded/failed/dead).

    Works inside a ``TestCase`` transaction. A job that fails with attempts left
    is put back with its backoff delay, so it is not run again by the same call
    unless the delay has already passed.

    When the connection fails while writing an outcome (the write may or may not
    have committed), it reconnects and redoes the write once: the outcome writes
    recognise their own committed write, so the job is reported exactly once. If
    the redo fails too (or the call runs inside a transaction, where reconnecting
    is impossible) it raises ``PgJobsError`` naming the job.

    Durable jobs: a job that sleeps or waits is left ``waiting`` (its ``RanJob``
    status); one whose time has come is woken and run. ``advance``: once the due jobs
    are done, move every waiting job's clock that far forward (its wake time and its
    recorded sleeps), then run what that made due: a three-day sleep is tested
    without sleeping.
    """
    if advance is not None and (not isinstance(advance, timedelta) or advance < timedelta(0)):
        raise ValueError(f"advance must be a timedelta >= 0, got {advance!r}")
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    worker = "testing.run_jobs"
    # refresh=0: re-read the queue rows before every claim, so a pause_queue() or an
    # admin edit made by the test between two jobs is seen at once. The queues made
    # fair by their rows are read once a call: a claim costs one statement.
    state = Claimant(queues, worker=worker, refresh=0.0, known_only=True, fair_rows_once=True)
    ran: list[RanJob] = []
    while max_jobs is None or len(ran) < max_jobs:
        claimed = state.take(connection, 1)
        if not claimed:
            if job_wake_due(connection):  # waiting jobs whose time came
                continue
            if advance is not None:
                job_advance_waiting(connection, advance.total_seconds(), queues)
                advance = None
                continue
            break
        job = claimed[0]
        signals.send(signals.job_started, **outcomes.signal_args(job, worker))
        outcome = execute(job, worker=worker, alias=alias)
        ours = _write(connection, job, outcome)
        outcomes.report(job, outcome, ours=ours, worker=worker)
        ran.append(
            RanJob(
                job.id,
                job.task,
                _STATUS[outcome.kind] if ours else "fenced",
                outcome.value,
                outcome.error,
            )
        )
    _warn_unknown(connection, state)
    return ran


def _warn_unknown(connection: Any, state: Claimant) -> None:
    """Say so when due jobs were left pending because their task is not registered
    in this process (a worker would leave them too): a silent skip puzzles a test."""
    from django.db.models import Q

    from django_pgjobs.models import Job

    due = (
        Job.objects.using(connection.alias)
        .filter(Q(status=JobStatus.PENDING), Q(run_at__lte=timezone.now()))
        .exclude(task__in=state.tasks)
    )
    if state.queues:
        due = due.filter(queue__in=state.queues)
    names = sorted(set(due.order_by().values_list("task", flat=True)[:100]))
    if names:
        logger.warning(
            "run_jobs left due jobs of unregistered task(s) pending: %s (import "
            "their module in the test, or list it in PGJOBS['JOB_MODULES'])",
            ", ".join(printable(repr(n)) for n in names[:5]),
        )


_CONNECTION_ERRORS = (OperationalError, InterfaceError)


def _write(connection: BaseDatabaseWrapper, job: Claimed, outcome: Outcome) -> bool:
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
            "have been updated"
        ) from first
    with contextlib.suppress(DatabaseError):
        connection.close()
    try:
        return outcomes.write(connection, job, outcome)
    except _CONNECTION_ERRORS as again:
        raise PgJobsError(
            f"run_jobs: {what} could not be written: the connection failed ({first}) "
            f"and the redo after reconnecting failed too ({again}); the job's row may "
            "or may not have been updated"
        ) from again
