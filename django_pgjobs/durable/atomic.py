"""``with context.atomic_step(name):``: the block's writes, the lease re-check and the
checkpoint in one transaction on the jobs' database, so they happen exactly once
across crashes, zombies and retries.

The order inside the transaction: the block, then ``STEP_RECORD`` (which locks the
job row and checks the lease, like an ``@job(atomic=True)`` job's completion: the
heartbeat is never blocked behind a long block), then the commit. A run whose lease
moved on rolls everything back (``RunFenced``); a crash before the commit leaves
neither the writes nor the checkpoint, and the next run does the block again.

Writes inside the block to another database alias cannot join that transaction, so
they are refused (an ``execute_wrapper`` on every other connection of the thread).

A replayed atomic step must skip its block, which a context manager cannot do by
itself: ``__enter__`` sets a trace function on the caller's frame that raises
``_SkipBlock`` at the block's first line, and ``__exit__`` swallows it and puts the
tracing back as it was (a debugger's or coverage's). ``step.result`` carries a value
out of the block: set inside it, stored with the checkpoint, and given back by a
replay.
"""

from __future__ import annotations

import re
import sys
from contextlib import ExitStack
from types import FrameType, TracebackType
from typing import Any

from django.db import connections, transaction

from django_pgjobs.durable import steps
from django_pgjobs.durable.run import DurableRun

#: Statements a block may still send to another alias: reads.
_WRITE = re.compile(
    r"^\s*(INSERT|UPDATE|DELETE|MERGE|TRUNCATE|CREATE|ALTER|DROP|COPY|GRANT|REVOKE|CALL|DO)\b"
    r"|\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b",
    re.IGNORECASE,
)


class OtherDatabaseWrite(RuntimeError):
    """A write to another database alias inside an atomic step (it could not commit
    with the step's transaction)."""


class _SkipBlock(Exception):
    pass


def _skip(frame: FrameType, event: str, arg: Any) -> Any:
    raise _SkipBlock


class AtomicStep:
    """What ``context.atomic_step(name)`` returns; ``result``: the step's stored value."""

    def __init__(self, run: DurableRun, name: str):
        self.run = run
        self.name = name
        self.result: Any = None
        self.replayed = False
        self._occurrence = 0
        self._stack: ExitStack | None = None
        self._frame: FrameType | None = None
        self._traces: tuple[Any, Any] = (None, None)

    def __enter__(self) -> AtomicStep:
        run = self.run
        run._refuse_in_atomic("an atomic step")
        self._occurrence = run.next_key(self.name)
        entry = run.replay(self.name, self._occurrence, "atomic")
        if entry is not None:
            self.replayed = True
            self.result = run.result_of(entry)
            frame = sys._getframe(1)
            self._frame = frame
            self._traces = (sys.gettrace(), frame.f_trace)
            sys.settrace(lambda *_: None)  # tracing on, so the frame's f_trace is called
            frame.f_trace = _skip
            return self
        stack = ExitStack()
        stack.enter_context(transaction.atomic(using=run.alias))
        try:
            for alias in connections:
                if alias != run.alias:
                    stack.enter_context(connections[alias].execute_wrapper(self._refuse(alias)))
        except BaseException:
            stack.__exit__(*sys.exc_info())
            raise
        self._stack = stack
        run.in_atomic = True
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self.replayed:
            if self._frame is not None:
                self._frame.f_trace = self._traces[1]
            sys.settrace(self._traces[0])
            self._frame = None
            return kind is _SkipBlock
        stack, self._stack = self._stack, None
        self.run.in_atomic = False
        assert stack is not None  # noqa: S101 - entered above
        if kind is None:
            try:
                encoded = steps.encode(self.result, f"atomic step {self.name!r} of {self.run.task}")
                self.run.record(self.name, self._occurrence, "atomic", self.result, encoded=encoded)
            except BaseException:
                if not stack.__exit__(*sys.exc_info()):
                    raise
                return False  # pragma: no cover - the transaction never swallows
        return bool(stack.__exit__(kind, exc, tb))

    def _refuse(self, alias: str) -> Any:
        step, job = self.name, self.run.job_id

        def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if isinstance(sql, str) and _WRITE.search(sql):
                raise OtherDatabaseWrite(
                    f"job {job}: atomic step {step!r} wrote to database {alias!r}; only "
                    f"writes to the jobs' database ({self.run.alias!r}) commit with the step"
                )
            return execute(sql, params, many, context)

        return refuse


def atomic_call(run: DurableRun, name: str, fn: Any, args: Any, kwargs: Any) -> Any:
    """``context.atomic_step(name, fn, *args, **kwargs)``: ``fn``'s call as the block,
    its return value the stored result."""
    with AtomicStep(run, name) as step:
        step.result = fn(*args, **kwargs)
    return step.result
