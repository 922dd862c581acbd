"""Who cancelled a task on the worker's event loop: the worker, the job that owns the
task, or someone else.

The loop is shared, so a job's code reaches every task on it
(``asyncio.all_tasks()``) and can cancel its neighbours'. The worker cancels tasks
too: a run past its timeout, a run taken back at shutdown. A neighbour cancelled by
another job did nothing wrong and must not be charged for it, and the job that
cancelled it should be.

Every task on the loop is a ``_Tracked`` task (the loop's task factory): it knows its
owner, the job whose code made it (a context variable, set in each job's task and
copied by asyncio into every task and callback that code makes), and when it is
cancelled it notes who asked: the job whose code was running then (the same
variable), the worker (its cancels run under ``by_the_worker``), or nobody known.
A cancel of a job's task, or of a task its code made, by anyone but that job or the
worker is *foreign*: the job is a victim, and the job that asked, when known, the
culprit.

What it cannot see: a cancel from another thread, or from a callback scheduled
outside any job (``call_soon_threadsafe`` from a job thread), names nobody: its
victims are given back and nobody is charged. So does a job that resets the context
variable on purpose. A task a job made that outlives the job's run cancels as that
job, but once the run has settled nothing is charged to it any more. A cancel that
reaches a neighbour after its outcome was handed on changes nothing. A cancel the
victim catches and swallows is its own business: if it then ends well it is
completed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

#: The worker's own cancels run under this owner (``by_the_worker``).
WORKER = "the worker"

#: The key of the job whose code runs (None: the worker's own code, or no job's).
_running: ContextVar[Hashable | None] = ContextVar("pgjobs_async_job", default=None)


@contextmanager
def by_the_worker() -> Iterator[None]:
    """Cancels made inside are the worker's (a timeout, a shutdown): never foreign."""
    token = _running.set(WORKER)
    try:
        yield
    finally:
        _running.reset(token)


def enter_job(key: Hashable) -> None:
    """In a job's own task, before its code runs: the tasks and callbacks it makes from
    here on belong to it."""
    _running.set(key)


@dataclass
class Verdict:
    """What foreign cancels did around one run of a job."""

    #: who cancelled its tasks (job keys; None for somebody unknown); empty: nobody
    hit_by: set[Hashable | None] = field(default_factory=set)
    #: whose tasks its code cancelled (job keys)
    struck: set[Hashable] = field(default_factory=set)


class _Tracked(asyncio.Task[Any]):
    """A task that tells its ledger who cancels it."""

    _pgjobs_owner: Hashable | None = None
    _pgjobs_ledger: CancelLedger | None = None

    def cancel(self, msg: Any | None = None) -> bool:
        ledger = self._pgjobs_ledger
        if ledger is not None and not self.done():
            ledger.noted(self._pgjobs_owner, _running.get())
        return super().cancel(msg)


class CancelLedger:
    """The foreign cancels of the jobs running on one loop, until each job settles."""

    def __init__(self) -> None:
        # Cancels come from the loop's thread, but a job may call cancel() from any.
        self._lock = threading.Lock()
        self._live: dict[Hashable, Verdict] = {}

    def task_factory(
        self, loop: asyncio.AbstractEventLoop, coro: Any, /, **kwargs: Any
    ) -> asyncio.Task[Any]:
        """The loop's task factory: every task is tracked, owned by the job that made it."""
        return self.track(_Tracked(coro, loop=loop, **kwargs), _running.get())

    def track(self, task: asyncio.Task[Any], owner: Hashable | None) -> asyncio.Task[Any]:
        if isinstance(task, _Tracked):
            task._pgjobs_owner = owner
            task._pgjobs_ledger = self
        return task

    def begin(self, key: Hashable) -> None:
        """The job ``key`` is on the loop: its cancels are recorded from now on."""
        with self._lock:
            self._live[key] = Verdict()

    def noted(self, owner: Hashable | None, by: Hashable | None) -> None:
        if by in (WORKER, owner):
            return  # the worker's cancel, or a job cancelling its own tasks
        with self._lock:
            victim = self._live.get(owner) if owner is not None else None
            if victim is None:
                return  # no job's, or a job already settled: nobody to give back
            victim.hit_by.add(by)
            culprit = self._live.get(by) if by is not None else None
            if culprit is not None:
                culprit.struck.add(owner)

    def settle(self, key: Hashable) -> Verdict:
        """What was recorded for the job ``key``; it is forgotten (a no-op the second time)."""
        with self._lock:
            return self._live.pop(key, None) or Verdict()
