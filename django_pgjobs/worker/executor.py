"""Run one claimed job and decide its outcome (no claiming, no batching here).

The worker threads and ``testing.run_jobs`` both call ``execute``; the decided
``Outcome`` is written by ``outcomes.py`` (an atomic job's completion too, from
inside the job's transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any, TypeVar

from django.db import connections, transaction

from django_pgjobs.claim.rows import Claimed
from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import encode_result, result_by_key
from django_pgjobs.durable.control import Parked, RunFenced, unparkable
from django_pgjobs.exceptions import JobTimeout, LeaseLost, TransactionLeftOpen, UnknownTask
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.chunking import ChunkItem, result_of
from django_pgjobs.jobs.context import JobContext
from django_pgjobs.jobs.definition import JobDefinition
from django_pgjobs.support import tracing
from django_pgjobs.support.decoding import Undecodable
from django_pgjobs.support.error_entries import error_entry, storable
from django_pgjobs.support.retry import backoff
from django_pgjobs.support.validation import check_json, check_result_size
from django_pgjobs.worker import job_connection, outcomes
from django_pgjobs.worker.failure_kinds import is_transaction_conflict
from django_pgjobs.worker.outcomes import Outcome
from django_pgjobs.workflows import results

logger = logging.getLogger("django_pgjobs")

#: Times an atomic job's transaction runs again, within its attempt, after losing a
#: race (serialization failure, deadlock): ``_execute_atomic``.
CONFLICT_RERUNS = 5
#: Seconds: the first re-run waits up to this long, each next one twice as long.
CONFLICT_BACKOFF = 0.02

_E = TypeVar("_E", bound=BaseException)


def make_context(claimed: Claimed, worker: str | None) -> JobContext:
    return JobContext(
        job_id=claimed.id,
        task=claimed.task,
        attempt=claimed.attempt,
        max_attempts=claimed.max_attempts,
        lease=claimed.lease,
        queue=claimed.queue,
        idempotency_key=claimed.idempotency_key,
        worker=worker,
    )


# A job that forks and returns (or raises) in the child must not go on as a worker
# there: the child would run the job-thread loop, orphaned, on the parent's database
# socket, with the worker's signal handlers. A fork made while a job runs marks the
# child; the child exits (os._exit: no atexit, no flush onto shared sockets) where the
# job returns in it.
_running = threading.local()
_forked_in_job = False


def _after_fork_in_child() -> None:
    global _forked_in_job
    if getattr(_running, "job", False):
        _forked_in_job = True
        for sig in (signal.SIGTERM, signal.SIGINT):  # the worker's graceful shutdown
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, signal.SIG_DFL)


os.register_at_fork(after_in_child=_after_fork_in_child)


def exit_if_forked_child(failed: bool) -> None:
    """In a process forked by a job, where the job returns: exit it."""
    if _forked_in_job:
        os._exit(1 if failed else 0)


def call_handler(
    definition: JobDefinition, context: JobContext, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    # a chunk handler takes the list of items alone: each item carries its context
    call_args = [context, *args] if definition.checked_takes_context else args
    _running.job = True
    failed = True
    try:
        if definition.is_async:
            value = asyncio.run(definition.func(*call_args, **kwargs))
        else:
            value = definition.func(*call_args, **kwargs)
        failed = False
        return value
    finally:
        _running.job = False
        exit_if_forked_child(failed)


def failure(
    definition: JobDefinition | None,
    claimed: Claimed,
    exc: BaseException,
    worker: str | None,
    *,
    started_at: float,
) -> Outcome:
    return retry_or_dead(
        definition, claimed, exc, error_entry(claimed.attempt, exc, worker, started_at)
    )


#: Attribute that marks an exception as never to be retried (``never_retry``).
NO_RETRY = "_pgjobs_no_retry"


def never_retry(exc: _E) -> _E:
    """Mark ``exc`` so the attempt that raised it is dead-lettered, attempts left or
    not: a return value that cannot be stored (the handler ran and its side effects
    happened; running it again cannot fix the value's type)."""
    setattr(exc, NO_RETRY, True)
    return exc


def retry_or_dead(
    definition: JobDefinition | None,
    claimed: Claimed,
    exc: BaseException,
    entry: dict[str, Any],
) -> Outcome:
    """The retry decision, in one place: retried after a backoff while attempts are
    left, unless ``exc`` is marked ``never_retry`` or the job's ``retry_on`` /
    ``discard_on`` say no; otherwise dead-lettered."""
    if (
        claimed.attempt < claimed.max_attempts
        and not getattr(exc, NO_RETRY, False)
        and (definition is None or definition.should_retry(exc))
    ):
        conf = get_settings()
        delay = backoff(claimed.attempt, base=conf.BACKOFF_BASE, cap=conf.BACKOFF_CAP)
        return Outcome("retry", error=entry, delay=delay, exception=exc)
    return Outcome("dead", error=entry, exception=exc)


#: (definition, args, kwargs, the parents' results of a workflow node or None)
Prepared = tuple[JobDefinition, list[Any], dict[str, Any], Mapping[str, Any] | None]


def prepare(
    claimed: Claimed, worker: str | None, alias: str, started_at: float
) -> Outcome | Prepared:
    """Everything before the handler: the definition, the stored arguments, the
    idempotency short-circuit. An Outcome when the job must not (or need not) run."""
    try:
        definition = registry.get(claimed.task)
    except UnknownTask as exc:
        return Outcome(
            "dead", error=error_entry(claimed.attempt, exc, worker, started_at), exception=exc
        )
    args, kwargs = claimed.args, claimed.kwargs
    if isinstance(args, Undecodable) or isinstance(kwargs, Undecodable):
        bad = args if isinstance(args, Undecodable) else kwargs
        reason = getattr(bad, "reason", bad)
        undecodable = ValueError(
            f"stored arguments of job {claimed.id} cannot be decoded: {reason}"
        )
        return Outcome(
            "dead",
            error=error_entry(claimed.attempt, undecodable, worker, started_at),
            exception=undecodable,
        )
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        wrong = TypeError(
            f"stored args must be a JSON array and kwargs a JSON object, got "
            f"{type(args).__name__} and {type(kwargs).__name__}"
        )
        return Outcome(
            "dead", error=error_entry(claimed.attempt, wrong, worker, started_at), exception=wrong
        )
    if claimed.idempotency_key is not None:
        try:
            found, value = result_by_key(connections[alias], claimed.idempotency_key)
        except BaseException as exc:  # noqa: BLE001 - a database blip is this attempt's failure
            return failure(definition, claimed, exc, worker, started_at=started_at)
        if found:
            return Outcome("completed", value=value, extra={"short_circuit": True})
    parents = None
    if claimed.has_parents:  # a workflow node: its parents' results, read now
        try:
            # an async handler runs on an event loop, where no query may wait: it gets
            # its parents' results read here, not as it uses them
            args, parents = results.with_parent_results(
                alias, claimed.id, args, lazy=not definition.is_async
            )
        except BaseException as exc:  # noqa: BLE001 - a database blip is this attempt's failure
            return failure(definition, claimed, exc, worker, started_at=started_at)
    return definition, args, kwargs, parents


def finish(
    definition: JobDefinition,
    claimed: Claimed,
    value: Any,
    worker: str | None,
    started_at: float,
) -> Outcome:
    """The handler returned ``value``: check and encode it here, in the job's own
    thread, so a value that cannot be stored fails this job alone."""
    if value is None:  # most jobs: nothing to check or store
        return Outcome("completed")
    if claimed.has_parents:  # it may return the results it was given, read as used
        try:
            value = results.plain(value)
        except BaseException as exc:  # noqa: BLE001 - a database blip is this attempt's failure
            return failure(definition, claimed, exc, worker, started_at=started_at)
    try:
        _check_return(value, claimed.task)
        encoded = encode_result(value)
    except BaseException as exc:  # noqa: BLE001 - RecursionError, ValueError from json.dumps
        # The handler ran and its side effects happened; re-running cannot fix its value.
        failed = exc
        bad = (
            exc
            if isinstance(exc, _BadReturn)
            else _BadReturn(
                f"the return value of {claimed.task} cannot be stored as JSON: "
                f"{type(exc).__name__}: {storable(lambda: str(failed))[:500]}"
            )
        )
        return failure(definition, claimed, bad, worker, started_at=started_at)
    return Outcome("completed", value=value, encoded=encoded)


def execute(
    claimed: Claimed,
    *,
    worker: str | None,
    alias: str,
    context: JobContext | None = None,
    tracer: Any = tracing.LOOK_UP,
) -> Outcome:
    """Run ``claimed`` in this thread; never raises (every failure becomes an Outcome)."""
    # when this attempt began, for its error entry: epoch seconds, made a datetime only
    # if the attempt fails (timezone.now() would be paid by every job)
    started_at = time.time()
    try:
        prepared = prepare(claimed, worker, alias, started_at)
        if isinstance(prepared, Outcome):
            return prepared
        definition, args, kwargs, parents = prepared
        context = context or make_context(claimed, worker)
        context.alias = alias
        if parents is not None:
            context.parent_results = parents
        if definition.atomic:
            return _execute_atomic(definition, claimed, context, worker, alias, started_at, args)
        try:
            with tracing.job_span(claimed, tracer):  # OpenTelemetry "<task> process" span
                if definition.chunk is None:
                    value = call_handler(definition, context, args, kwargs)
                else:  # a chunk of one: a suspect run alone, or testing.run_jobs
                    given = context if definition.takes_context else None
                    item = ChunkItem(claimed.id, args, kwargs, given)
                    value = call_handler(definition, context, [[item]], {})
                    value = result_of(value, claimed.id, (claimed.id,), claimed.task)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt are job failures here
            if job_connection.left_open(alias):
                job_connection.close(alias)
                if isinstance(exc, Parked | RunFenced):
                    exc = left_open_error(claimed)
            return _ended(exc) or failure(definition, claimed, exc, worker, started_at=started_at)
        if job_connection.left_open(alias):
            job_connection.close(alias)  # the server rolls back what it wrote since BEGIN
            return failure(
                definition, claimed, left_open_error(claimed), worker, started_at=started_at
            )
        return finish(definition, claimed, value, worker, started_at)
    except BaseException as exc:  # noqa: BLE001 - last resort: never let a thread die
        return last_resort(claimed, exc, worker)


async def aexecute(
    claimed: Claimed,
    *,
    worker: str | None,
    alias: str,
    context: JobContext,
    tracer: Any = tracing.LOOK_UP,
) -> Outcome:
    """Run an ``async def`` job on the caller's event loop; never raises except
    ``asyncio.CancelledError`` when the worker cancels the run (timeout, shutdown)."""
    from asgiref.sync import sync_to_async

    started_at = time.time()
    try:
        epoch = (await job_connection.shared_watch(alias)).rollbacks  # hops once a process
        prepared = (
            await sync_to_async(_prepare_off_loop, thread_sensitive=False)(
                claimed, worker, alias, started_at
            )
            if claimed.idempotency_key is not None or claimed.has_parents
            else prepare(claimed, worker, alias, started_at)
        )
        if isinstance(prepared, Outcome):
            return prepared
        definition, args, kwargs, parents = prepared
        if parents is not None:
            context.parent_results = parents
        context.alias = alias
        call_args = [context, *args] if definition.takes_context else args
        _running.job = True  # the worker's loop thread runs nothing but jobs
        try:
            with tracing.job_span(claimed, tracer):  # OpenTelemetry span (or a no-op)
                value = await definition.func(*call_args, **kwargs)
        except asyncio.CancelledError:
            exit_if_forked_child(True)
            raise
        except BaseException as exc:  # noqa: BLE001
            exit_if_forked_child(True)
            if await job_connection.async_left_open(alias, epoch) and isinstance(exc, Parked):
                exc = left_open_error(claimed, shared=True)  # rolled back: not a clean park
            return _ended(exc) or failure(definition, claimed, exc, worker, started_at=started_at)
        exit_if_forked_child(False)
        if await job_connection.async_left_open(alias, epoch):
            left = left_open_error(claimed, shared=True)
            return failure(definition, claimed, left, worker, started_at=started_at)
        return finish(definition, claimed, value, worker, started_at)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001
        return last_resort(claimed, exc, worker)


def _prepare_off_loop(
    claimed: Claimed, worker: str | None, alias: str, started_at: float
) -> Outcome | Prepared:
    """``prepare`` for an async job, on a thread of the event loop's executor. No
    request cycle ever ends there, so after a failure (a restart, a failover) the
    thread drops its connection if it is unusable, as Django does at a request's end;
    else every later keyed async job on that thread failed with "the connection is
    closed"."""
    prepared = prepare(claimed, worker, alias, started_at)
    if isinstance(prepared, Outcome) and prepared.kind in ("retry", "dead"):
        with contextlib.suppress(Exception):  # the next failure tries again
            job_connection.tidy(alias)
    return prepared


def _ended(exc: BaseException) -> Outcome | None:
    """The outcome of a durable run that ended early (durable/control.py): parked, or
    fenced while recording a step; None for any other exception."""
    if isinstance(exc, Parked):
        return Outcome("waiting", extra={"parked": exc})
    if isinstance(exc, RunFenced):
        return Outcome("fenced", exception=LeaseLost(str(exc)))
    return None


def left_open_error(claimed: Claimed, *, shared: bool = False) -> TransactionLeftOpen:
    by = (
        "the async jobs' shared ORM connection was left in a transaction (a BEGIN "
        "without COMMIT, by this job or an async job running beside it)"
        if shared
        else "it returned with a transaction open on its connection (a BEGIN without COMMIT)"
    )
    return TransactionLeftOpen(
        f"job {claimed.id} ({claimed.task}): {by}; what it wrote since was rolled back. "
        "Use transaction.atomic() or @job(atomic=True)"
    )


def last_resort(claimed: Claimed, exc: BaseException, worker: str | None) -> Outcome:
    """An exception escaped the executor itself: fail the attempt, never leaving the
    row pending with its attempts used up."""
    entry = error_entry(claimed.attempt, exc, worker)  # never raises
    return retry_or_dead(None, claimed, exc, entry)


def timed_out(
    claimed: Claimed, seconds: float, worker: str | None, started_at: float | None = None
) -> Outcome:
    """The outcome of a run the worker gave up on after ``seconds``: retried or
    dead-lettered like any failure (``retry_on``/``discard_on`` apply), written
    with a lease bump (``extra["timed_out"]``)."""
    exc = JobTimeout(
        f"job {claimed.id} ({claimed.task}) exceeded its timeout of "
        f"{seconds:g}s; the worker gave up on it (its lease was bumped, so "
        "its later writes are fenced)"
    )
    definition = registry.find(claimed.task)
    outcome = failure(definition, claimed, exc, worker, started_at=started_at or time.time())
    outcome.extra["timed_out"] = True
    return outcome


class _Fenced(Exception):
    pass


class _BadReturn(TypeError):
    """A return value that cannot be stored: never retried (see ``never_retry``)."""

    _pgjobs_no_retry = True  # NO_RETRY, set on the class


def _check_return(value: Any, task: str) -> None:
    try:
        # A whole float >= 1e16 coming back as an int is no reason to dead-letter a job.
        check_json(value, f"the return value of {task}", exact_floats=False)
        check_result_size(value, task)  # PGJOBS["MAX_RESULT_BYTES"]
    except TypeError as exc:
        raise _BadReturn(str(exc)) from None
    except RecursionError:
        raise _BadReturn(
            f"the return value of {task} is nested too deeply to store as JSON"
        ) from None


def _execute_atomic(
    definition: JobDefinition,
    claimed: Claimed,
    context: JobContext,
    worker: str | None,
    alias: str,
    started_at: float,
    args: list[Any],
) -> Outcome:
    """Handler, lease re-check, completion and result in ONE transaction.

    The lease is checked (and the row locked) only after the handler, so the
    heartbeat thread is never blocked behind a long job; if the lease moved on
    meanwhile, everything the handler wrote is rolled back.

    A transaction that lost a race (a serialization failure or a deadlock) was rolled
    back whole, the handler's writes with it, so it runs again after a short jittered
    wait, up to ``CONFLICT_RERUNS`` times, before it counts as a failed attempt: under
    ``SERIALIZABLE`` the completion's own index reads conflict with the neighbours'
    completions, and those conflicts used up atomic jobs' attempts.
    """
    connection = connections[alias]
    for rerun in range(CONFLICT_RERUNS + 1):
        try:
            with transaction.atomic(using=alias):
                with tracing.job_span(claimed):  # OpenTelemetry span (or a no-op)
                    value = call_handler(definition, context, args, claimed.kwargs)
                if claimed.has_parents:  # what it was given may be in what it returns
                    value = results.plain(value)
                _check_return(value, claimed.task)
                if not outcomes.complete(connection, claimed, value):
                    raise _Fenced
        except BaseException as exc:  # noqa: BLE001 - sorted out below
            if rerun < CONFLICT_RERUNS and is_transaction_conflict(exc):
                logger.info(
                    "job %s (%s): its transaction lost a race and was rolled back (%s); "
                    "running it again (%d of %d)",
                    claimed.id,
                    claimed.task,
                    type(exc).__name__,
                    rerun + 1,
                    CONFLICT_RERUNS,
                    extra=outcomes.log_extra(claimed, worker),
                )
                # full jitter: the transactions it raced are likely still running
                time.sleep(random.uniform(0, CONFLICT_BACKOFF * 2**rerun))
                continue
            return _atomic_failed(definition, claimed, exc, worker, started_at)
        return Outcome("completed", value=value, written=True)
    raise AssertionError("unreachable: the last run returns")  # pragma: no cover


def _atomic_failed(
    definition: JobDefinition,
    claimed: Claimed,
    exc: BaseException,
    worker: str | None,
    started_at: float,
) -> Outcome:
    if isinstance(exc, _Fenced | RunFenced):
        return Outcome(
            "fenced",
            exception=LeaseLost(
                f"job {claimed.id} lease {claimed.lease} is no longer current; "
                "its transaction was rolled back"
            ),
        )
    return failure(definition, claimed, unparkable(exc), worker, started_at=started_at)
