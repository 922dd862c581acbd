"""Run one claimed job and decide its outcome (no claiming, no batching here).

The worker threads and ``testing.run_jobs`` both call ``execute``; the decided
``Outcome`` is written by ``outcomes.py`` (an atomic job's completion too, from
inside the job's transaction).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db import connections, transaction
from django.utils import timezone

from django_pgjobs import registry, sql, tracing
from django_pgjobs.conf import get_settings
from django_pgjobs.context import JobContext
from django_pgjobs.decorators import JobDefinition
from django_pgjobs.exceptions import JobTimeout, LeaseLost, UnknownTask
from django_pgjobs.retry import backoff
from django_pgjobs.validation import check_json, check_result_size
from django_pgjobs.worker import outcomes
from django_pgjobs.worker.outcomes import Outcome

logger = logging.getLogger("django_pgjobs")

_E = TypeVar("_E", bound=BaseException)


def error_entry(
    attempt: int, exc: BaseException, worker: str | None, started_at: datetime | None = None
) -> dict[str, Any]:
    """One entry of ``Job.errors``: attempt, time, exception type, message, traceback.

    ``started_at``: when the attempt began running. The row keeps only the latest
    claim's start, so this is how the Tasks backend knows when the first attempt
    started; entries without it (the reaper's) fall back to ``at``.
    """
    cls = type(exc)
    entry = {
        "attempt": attempt,
        "at": timezone.now().isoformat(),
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": _storable(lambda: str(exc))[:2000],
        "traceback": _storable(lambda: "".join(traceback.format_exception(exc)))[-20000:],
        "worker": worker,
    }
    if started_at is not None:
        entry["started_at"] = started_at.isoformat()
    return entry


def _storable(text: Callable[[], str]) -> str:
    """Text PostgreSQL can store: a NUL byte or a lone surrogate in an error message
    would make the write of the outcome fail forever (a poison completion)."""
    try:
        value = text()
    except BaseException as exc:  # noqa: BLE001 - a __str__ that raises (even SystemExit)
        value = f"<unprintable: {type(exc).__name__}>"
    if not isinstance(value, str):
        value = "<unprintable: __str__ returned no text>"
    value = value.replace("\x00", "\\x00")
    if not value.isascii():
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def make_context(claimed: sql.Claimed, worker: str | None) -> JobContext:
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


def _call(
    definition: JobDefinition, context: JobContext, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    call_args = [context, *args] if definition.takes_context else args
    if definition.is_async:
        return asyncio.run(definition.func(*call_args, **kwargs))
    return definition.func(*call_args, **kwargs)


def _failure(
    definition: JobDefinition | None,
    claimed: sql.Claimed,
    exc: BaseException,
    worker: str | None,
    *,
    started_at: datetime,
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
    claimed: sql.Claimed,
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


Prepared = tuple[JobDefinition, list[Any], dict[str, Any]]


def _prepare(
    claimed: sql.Claimed, worker: str | None, alias: str, started_at: datetime
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
    if isinstance(args, sql.Undecodable) or isinstance(kwargs, sql.Undecodable):
        bad = args if isinstance(args, sql.Undecodable) else kwargs
        undecodable = ValueError(f"stored arguments of job {claimed.id} cannot be decoded: {bad}")
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
            found, value = sql.result_for_key(connections[alias], claimed.idempotency_key)
        except BaseException as exc:  # noqa: BLE001 - a database blip is this attempt's failure
            return _failure(definition, claimed, exc, worker, started_at=started_at)
        if found:
            return Outcome("completed", value=value, extra={"short_circuit": True})
    return definition, args, kwargs


def _finish(
    definition: JobDefinition,
    claimed: sql.Claimed,
    value: Any,
    worker: str | None,
    started_at: datetime,
) -> Outcome:
    """The handler returned ``value``: check and encode it here, in the job's own
    thread, so a value that cannot be stored fails this job alone."""
    try:
        _check_return(value, claimed.task)
        encoded = sql.encode_result(value)
    except BaseException as exc:  # noqa: BLE001 - RecursionError, ValueError from json.dumps
        # The handler ran and its side effects happened; re-running cannot fix its value.
        failed = exc
        bad = (
            exc
            if isinstance(exc, _BadReturn)
            else _BadReturn(
                f"the return value of {claimed.task} cannot be stored as JSON: "
                f"{type(exc).__name__}: {_storable(lambda: str(failed))[:500]}"
            )
        )
        return _failure(definition, claimed, bad, worker, started_at=started_at)
    return Outcome("completed", value=value, encoded=encoded)


def execute(
    claimed: sql.Claimed, *, worker: str | None, alias: str, context: JobContext | None = None
) -> Outcome:
    """Run ``claimed`` in this thread; never raises (every failure becomes an Outcome)."""
    started_at = timezone.now()  # when this attempt began, for its error entry
    try:
        prepared = _prepare(claimed, worker, alias, started_at)
        if isinstance(prepared, Outcome):
            return prepared
        definition, args, kwargs = prepared
        context = context or make_context(claimed, worker)
        if definition.atomic:
            return _execute_atomic(definition, claimed, context, worker, alias, started_at)
        try:
            with tracing.job_span(claimed):  # OpenTelemetry "<task> process" span (or a no-op)
                value = _call(definition, context, args, kwargs)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt are job failures here
            return _failure(definition, claimed, exc, worker, started_at=started_at)
        return _finish(definition, claimed, value, worker, started_at)
    except BaseException as exc:  # noqa: BLE001 - last resort: never let a thread die
        return last_resort(claimed, exc, worker)


async def aexecute(
    claimed: sql.Claimed, *, worker: str | None, alias: str, context: JobContext
) -> Outcome:
    """Run an ``async def`` job on the caller's event loop; never raises except
    ``asyncio.CancelledError`` when the worker cancels the run (timeout, shutdown)."""
    from asgiref.sync import sync_to_async

    started_at = timezone.now()
    try:
        prepared = (
            await sync_to_async(_prepare, thread_sensitive=False)(
                claimed, worker, alias, started_at
            )
            if claimed.idempotency_key is not None
            else _prepare(claimed, worker, alias, started_at)
        )
        if isinstance(prepared, Outcome):
            return prepared
        definition, args, kwargs = prepared
        call_args = [context, *args] if definition.takes_context else args
        try:
            with tracing.job_span(claimed):  # OpenTelemetry span (or a no-op)
                value = await definition.func(*call_args, **kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001
            return _failure(definition, claimed, exc, worker, started_at=started_at)
        return _finish(definition, claimed, value, worker, started_at)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001
        return last_resort(claimed, exc, worker)


def last_resort(claimed: sql.Claimed, exc: BaseException, worker: str | None) -> Outcome:
    """An exception escaped the executor itself: fail the attempt, never leaving the
    row pending with its attempts used up."""
    try:
        entry = error_entry(claimed.attempt, exc, worker)
    except BaseException:  # noqa: BLE001
        entry = {
            "attempt": claimed.attempt,
            "at": timezone.now().isoformat(),
            "type": "builtins.BaseException",
            "message": "<unprintable>",
            "traceback": None,
            "worker": worker,
        }
    return retry_or_dead(None, claimed, exc, entry)


def timed_out(
    claimed: sql.Claimed, seconds: float, worker: str | None, started_at: datetime | None = None
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
    outcome = _failure(definition, claimed, exc, worker, started_at=started_at or timezone.now())
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
    claimed: sql.Claimed,
    context: JobContext,
    worker: str | None,
    alias: str,
    started_at: datetime,
) -> Outcome:
    """Handler, lease re-check, completion and result in ONE transaction.

    The lease is checked (and the row locked) only after the handler, so the
    heartbeat thread is never blocked behind a long job; if the lease moved on
    meanwhile, everything the handler wrote is rolled back.
    """
    connection = connections[alias]
    try:
        with transaction.atomic(using=alias):
            with tracing.job_span(claimed):  # OpenTelemetry span (or a no-op)
                value = _call(definition, context, claimed.args, claimed.kwargs)
            _check_return(value, claimed.task)
            if not outcomes.complete(connection, claimed, value):
                raise _Fenced
    except _Fenced:
        return Outcome(
            "fenced",
            exception=LeaseLost(
                f"job {claimed.id} lease {claimed.lease} is no longer current; "
                "its transaction was rolled back"
            ),
        )
    except BaseException as exc:  # noqa: BLE001
        return _failure(definition, claimed, exc, worker, started_at=started_at)
    return Outcome("completed", value=value, written=True)
