"""``JobContext``: what a running job may know about its own execution."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django_pgjobs.durable.atomic import AtomicStep, atomic_call
from django_pgjobs.durable.events import wait_for_event
from django_pgjobs.durable.run import DurableRun
from django_pgjobs.durable.signals import wait_for_signal
from django_pgjobs.exceptions import JobCancelled


@dataclass
class JobContext:
    """Passed as the first argument to ``@job(takes_context=True)`` functions.

    ``lease`` is the fencing token of this attempt: writes made on its behalf are
    accepted only while the row still carries it. ``is_cancelled()`` turns true
    when the job is cancelled or its lease is lost (seen at the next heartbeat).
    ``parent_results``: for a workflow node, each parent node's name (default: its
    job id as a string) -> its result (None for a parent that stored none); a
    read-only mapping that reads each result when it is asked for (a plain dict in
    an async job).

    Durable jobs (docs/howto/durable-jobs.md): ``step``, ``atomic_step``, ``sleep``,
    ``sleep_until``, ``patched``, ``wait_for_signal`` and ``wait_for_event`` record
    what the run did under its lease, so a later run of the job (after a sleep, a
    crash, a retry) skips what is done. An ``async def`` job awaits ``astep``,
    ``asleep``, ``asleep_until``, ``await_for_signal`` and ``await_for_event``.
    """

    job_id: int
    task: str
    attempt: int
    max_attempts: int
    lease: int
    queue: str
    idempotency_key: str | None = None
    worker: str | None = None
    parent_results: Mapping[str, Any] = field(default_factory=dict)
    # A plain flag, not a threading.Event: one is made per claimed job, and Event()
    # (a Condition and two locks) is a large share of the claim loop's work per job.
    # Setting and reading a bool is atomic under the GIL.
    _cancelled: bool = field(default=False, repr=False)
    #: The jobs' database alias (None: PGJOBS["DATABASE"]).
    alias: str | None = field(default=None, repr=False)
    _durable: DurableRun | None = field(default=None, repr=False)

    def is_cancelled(self) -> bool:
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        if self._cancelled:
            raise JobCancelled(f"job {self.job_id} was cancelled or lost its lease")

    def cancel(self) -> None:
        """Mark cancelled (called by the worker when the row says so)."""
        self._cancelled = True

    @property
    def durable_run(self) -> DurableRun:
        """This run's durable state, made at its first durable call (durable/run.py)."""
        if self._durable is None:
            self._durable = DurableRun(
                job_id=self.job_id, lease=self.lease, task=self.task, alias=self.alias
            )
        return self._durable

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``'s result, stored under ``name`` (and the n-th call of
        that name in this run) with the lease checked; a later run of the job returns
        the stored result without calling ``fn``. A step that raises is not stored."""
        return self.durable_run.step(name, fn, *args, **kwargs)

    def atomic_step(
        self, name: str, fn: Callable[..., Any] | None = None, /, *args: Any, **kwargs: Any
    ) -> Any:
        """``with context.atomic_step(name) as step:`` the block, the lease check and
        the checkpoint in one transaction on the jobs' database (a replay skips the
        block; ``step.result`` carries a value out). With ``fn``: ``fn(*args,
        **kwargs)`` is the block, and its stored result is returned."""
        if fn is None:
            return AtomicStep(self.durable_run, name)
        return atomic_call(self.durable_run, name, fn, args, kwargs)

    def sleep(self, name: str, duration: timedelta | float) -> None:
        """End this run and wake the job ``duration`` from its first arrival here
        (a timedelta or seconds); a finished sleep is passed on later runs."""
        self.durable_run.sleep(name, duration)

    def sleep_until(self, name: str, when: datetime) -> None:
        """``sleep`` until an aware datetime."""
        self.durable_run.sleep_until(name, when)

    def patched(self, name: str) -> bool:
        """True for runs that reach this point with the code that added ``name``,
        False for runs that were already past it: both branches stay replay-safe."""
        return self.durable_run.patched(name)

    def wait_for_signal(self, name: str, *, timeout: timedelta | float | None = None) -> Any:
        """The payload of the oldest signal ``name`` sent to this job and not yet
        consumed, consumed exactly once; with none, the run ends and the job waits
        (holding no worker) until one is sent or ``timeout`` (from this wait's first
        arrival) passes, and then returns None. A later run returns the same value."""
        return wait_for_signal(self.durable_run, name, timeout)

    def wait_for_event(
        self,
        name: str,
        *,
        key: str | None = None,
        timeout: timedelta | float | None = None,
        lookback: timedelta | float | None = None,
    ) -> Any:
        """The payload of the oldest event ``(name, key)`` emitted since ``lookback``
        (default ``PGJOBS["EVENT_LOOKBACK"]``) before this wait first began; with none,
        the run ends and the job waits until one is emitted or ``timeout`` passes (then
        None). A later run returns the same value."""
        return wait_for_event(self.durable_run, name, key, timeout, lookback)

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``step`` for an ``async def`` job: ``fn`` may be a coroutine function."""
        return await _async_step(self.durable_run, name, fn, args, kwargs)

    async def asleep(self, name: str, duration: timedelta | float) -> None:
        """``sleep`` for an ``async def`` job."""
        await _off_loop(self.durable_run.sleep, name, duration)

    async def asleep_until(self, name: str, when: datetime) -> None:
        """``sleep_until`` for an ``async def`` job."""
        await _off_loop(self.durable_run.sleep_until, name, when)

    async def apatched(self, name: str) -> bool:
        """``patched`` for an ``async def`` job."""
        return bool(await _off_loop(self.durable_run.patched, name))

    async def await_for_signal(self, name: str, *, timeout: timedelta | float | None = None) -> Any:
        """``wait_for_signal`` for an ``async def`` job."""
        return await _off_loop(wait_for_signal, self.durable_run, name, timeout)

    async def await_for_event(
        self,
        name: str,
        *,
        key: str | None = None,
        timeout: timedelta | float | None = None,
        lookback: timedelta | float | None = None,
    ) -> Any:
        """``wait_for_event`` for an ``async def`` job."""
        return await _off_loop(wait_for_event, self.durable_run, name, key, timeout, lookback)


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """A durable call of an async job, on a worker thread: it queries the database."""
    from asgiref.sync import sync_to_async  # Django's dependency; off the sync path

    return await sync_to_async(fn, thread_sensitive=False)(*args)


async def _async_step(
    run: DurableRun, name: str, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    run._refuse_in_atomic("a step")
    occurrence = run.next_key(name)
    entry = await _off_loop(run.replay, name, occurrence, "step")
    if entry is not None:
        return await _off_loop(run.result_of, entry)
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    await _off_loop(run.record, name, occurrence, "step", value)
    return value
