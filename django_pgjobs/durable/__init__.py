"""Durable jobs: steps that never run twice, sleeps that hold no worker, code changes
that do not strand a running job (docs/howto/durable-jobs.md).

The parts, each in its module:

* ``models.py``: ``JobStep`` (a job's recorded steps, pruned with the job) and the
  columns a parked job uses on its row (``waiting_for``, ``wakes``);
* ``steps.py``: the step storage a waiting primitive calls in its own transaction
  (``recorded``, ``record`` under the lease, ``encode``);
* ``run.py``: ``DurableRun``, one run matched against its recorded history
  (``step``, ``sleep``, ``patched``; ``next_key`` / ``replay`` / ``record`` for
  further primitives), ``NonDeterministic`` when the code contradicts it;
* ``atomic.py``: ``atomic_step``, the block and its checkpoint in one transaction;
* ``control.py``: ``Parked`` (the run ends, the job waits: the executor's outcome
  "waiting", written by ``JOB_PARK`` with the attempt not counted and the slot
  freed) and ``RunFenced``.
* ``signal_models.py``: ``JobSignal`` (a message to one job, deleted with it) and
  ``JobEvent`` (by name and key, pruned by age);
* ``signals.py`` / ``events.py``: ``send_signal`` and ``emit_event``, written in the
  caller's transaction (``payloads.py`` checks what they carry).

The statements are in ``db/durable.py`` (signals and events: ``db/job_signals.py``,
``db/events.py``); the wake pass that moves due waiting jobs
back to pending in ``maintenance/wakes.py``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: The ``JobContext`` of the Django task running in this context (the Tasks bridge
#: sets it around the task's call), for ``django_pgjobs.durable(context)``.
_task_job: ContextVar[Any] = ContextVar("pgjobs_task_job", default=None)


@contextmanager
def task_running(job_context: Any) -> Iterator[None]:
    """While a Django task runs as a job: ``durable(context)`` finds its job."""
    token = _task_job.set(job_context)
    try:
        yield
    finally:
        _task_job.reset(token)


def for_task(context: Any) -> Any:
    """``django_pgjobs.durable(context)``: the durable calls (``step``, ``atomic_step``,
    ``sleep``, ``sleep_until``, ``wait_for_signal``, ``wait_for_event``, ``patched``: a
    ``JobContext``) of the Django task whose ``TaskContext`` is ``context``, run by a
    worker of a ``PgJobsBackend``."""
    job = _task_job.get()
    result = getattr(context, "task_result", None)
    if job is None:
        raise RuntimeError(
            "django_pgjobs.durable(context) works inside a task that a django-pgjobs "
            "worker runs (a PgJobsBackend task with takes_context=True)"
        )
    if result is None or str(getattr(result, "id", "")) != str(job.job_id):
        raise TypeError(
            "django_pgjobs.durable(context) takes the TaskContext the running task was "
            f"given, got {type(context).__name__}"
        )
    return job


class _CallableModule(types.ModuleType):
    """This package, callable: ``django_pgjobs.durable(context)`` is ``for_task``.

    A function named ``durable`` in ``django_pgjobs`` cannot serve: importing any
    module of this package binds ``django_pgjobs.durable`` to the package itself,
    replacing the function, so the package is what the name must call."""

    def __call__(self, context: Any) -> Any:
        return for_task(context)


sys.modules[__name__].__class__ = _CallableModule
