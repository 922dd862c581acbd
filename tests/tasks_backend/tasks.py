"""Fixture tasks, shaped like Django's tests/tasks/tasks.py, plus pgjobs-specific ones.

Autodiscovered by ``runjobs`` (this package is an installed app in the test settings).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import django
from django.tasks import TaskContext, task

from django_pgjobs import job


@task
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def noop_task_from_bare_decorator(*args: Any, **kwargs: Any) -> None:
    return None


@task
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task
def calculate_meaning_of_life() -> int:
    return 42


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": args, "kwargs": kwargs}


@task
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task
def complex_return_value() -> Any:
    # A lambda is not JSON: the task fails with TypeError, and is not retried.
    return lambda: True


@task
def add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def get_context(context: TaskContext) -> dict[str, Any]:
    result = context.task_result
    return {
        "id": result.id,
        "attempt": context.attempt,
        "worker_ids": result.worker_ids,
        "status": str(result.status),
        "thread": threading.current_thread().name,
    }


@task(takes_context=True)
def status_inside(context: TaskContext) -> str:
    """What get_result says about this task while it runs."""
    return str(status_inside.get_result(context.task_result.id).status)


@task(takes_context=True)
def fail_until(context: TaskContext, succeed_on: int) -> int:
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return context.attempt


@task(backend="retrying", queue_name="anything")
def always_fails() -> None:
    raise RuntimeError("always fails")


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
async def async_context(context: TaskContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"attempt": context.attempt, "id": context.task_result.id}


@task
def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


@job
def plain_job(x: int) -> int:
    """A @job next to the tasks: same table, same workers."""
    return x * 2


@task
def reindex_doc(doc_id: int, version: int = 0) -> dict[str, int]:
    """Debounced per call: ``.using(debounce=..., debounce_key=...)``."""
    return {"doc_id": doc_id, "version": version}


if django.VERSION >= (6, 1):
    # Django 6.1 passes extra @task keyword arguments to the backend's task_class.
    @task(debounce=0.2, debounce_key="doc:{doc_id}", keep="first")
    def reindex_doc_first(doc_id: int, version: int = 0) -> dict[str, int]:
        return {"doc_id": doc_id, "version": version}

    @task(max_attempts=2, retry_on=RuntimeError)
    def fails_with_max_two() -> None:
        raise RuntimeError("fails")

    @task(max_attempts=5, discard_on=KeyError)
    def discards_key_error() -> None:
        raise KeyError("gone")


@task(takes_context=True)
def loses_its_lease(context: TaskContext) -> str:
    """Moves its own row's lease on (as a reaper or cancel would): its completion is fenced."""
    from django.db.models import F

    from django_pgjobs.models import Job

    Job.objects.filter(pk=int(context.task_result.id)).update(lease=F("lease") + 1)
    return "done"


DURABLE_CALLS: list[str] = []


@task(takes_context=True)
def durable_task(context: TaskContext, n: int) -> list[int]:
    """A Django task with durable steps and a sleep (django_pgjobs.durable(context))."""
    import django_pgjobs

    steps = django_pgjobs.durable(context)
    first = steps.step("first", lambda: DURABLE_CALLS.append("first") or n + 1)
    steps.sleep("nap", 3600)
    second = steps.step("second", lambda: DURABLE_CALLS.append("second") or first * 2)
    return [first, second]


@task(takes_context=True)
def approval_task(context: TaskContext) -> object:
    """A Django task waiting for a signal (django_pgjobs.durable(context))."""
    import django_pgjobs

    answer = django_pgjobs.durable(context).wait_for_signal("approval", timeout=3600)
    return None if answer is None else answer["ok"]
