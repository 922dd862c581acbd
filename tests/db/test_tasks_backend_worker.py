"""Running tasks: enqueue -> run the worker -> refresh (Django's immediate-backend
assertions, flipped for a queue), with retries, cancel, context, async and signals."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from django_pgjobs.backend import TASKS_AVAILABLE

if not TASKS_AVAILABLE:
    pytest.skip(
        "django.tasks needs Django >= 6.0; only test_import runs on this Django",
        allow_module_level=True,
    )

import django
from django.db import connection
from django.tasks import TaskResultStatus
from django.tasks.signals import task_enqueued, task_finished, task_started

from django_pgjobs.backend import PgJobsBackend
from django_pgjobs.db.job_admin import job_cancel
from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from django_pgjobs.worker.loop import Worker
from tests.tasks_backend import tasks as t
from tests.tasks_backend.helpers import drain

# Transactional: inside a test transaction now() stands still, so retries would never
# come due and timestamps taken by the worker would precede the enqueue's.
pytestmark = pytest.mark.django_db(transaction=True)


def _job(result: Any) -> Job:
    return Job.objects.get(pk=int(result.id))


def test_success_path() -> None:
    result = t.calculate_meaning_of_life.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 42
    assert result.attempts == 1 and result.worker_ids == ["testing.run_jobs"]
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at  # type: ignore[operator]
    assert result.last_attempted_at == result.started_at
    assert t.calculate_meaning_of_life.get_result(result.id) == result


def test_return_value_round_trips_exactly() -> None:
    result = t.echo.enqueue(1, [2, {"x": None}], y=1.5, z=True)
    drain()
    result.refresh()
    assert result.return_value == {"args": [1, [2, {"x": None}]], "kwargs": {"y": 1.5, "z": True}}
    assert Job.objects.get(pk=int(result.id)).result == result.return_value


def test_async_task_runs() -> None:
    results = [t.async_add.enqueue(2, 3), t.noop_task_async.enqueue(), t.async_context.enqueue()]
    drain()
    for r in results:
        r.refresh()
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 3
    assert results[0].return_value == 5
    assert results[2].return_value == {"attempt": 1, "id": results[2].id}


def test_running_status_is_visible_inside_the_task() -> None:
    result = t.status_inside.enqueue()
    drain()
    result.refresh()
    assert result.return_value == "RUNNING"


def test_context_matches_the_job() -> None:
    result = t.get_context.enqueue()
    drain()
    result.refresh()
    value = result.return_value
    assert value["id"] == result.id and value["attempt"] == 1 == _job(result).attempts
    assert value["worker_ids"] == ["testing.run_jobs"] and value["status"] == "RUNNING"


def test_retry_then_success_keeps_one_error_per_failed_attempt() -> None:
    result = t.fail_until.enqueue(3)
    assert len(run_jobs(max_jobs=1)) == 1  # exactly the first attempt
    result.refresh()
    assert result.status == TaskResultStatus.READY  # failed once, ready to run again
    assert len(result.errors) == 1 and result.attempts == 1
    assert result.errors[0].exception_class is RuntimeError
    drain(until=lambda: _job(result).status == "completed")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3 == _job(result).attempts == result.attempts
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "attempt 2 fails on purpose" in result.errors[1].traceback
    assert result.worker_ids == ["testing.run_jobs"] * 3
    assert result.started_at < result.last_attempted_at  # type: ignore[operator]
    # The first attempt's start comes from its error entry, not from when it failed.
    first = _job(result).errors[0]
    started = datetime.fromisoformat(first["started_at"])
    assert started <= datetime.fromisoformat(first["at"])
    assert result.started_at == started


def test_failure_path_after_the_last_attempt() -> None:
    result = t.always_fails.enqueue()  # OPTIONS max_attempts=3 on the "retrying" backend
    drain(until=lambda: _job(result).status == "dead")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    assert result.attempts == 3 and len(result.errors) == 3
    assert result.errors[-1].exception_class is RuntimeError
    assert "Traceback (most recent call last)" in result.errors[-1].traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


@pytest.mark.parametrize(
    ("task_name", "exc"),
    [
        ("failing_task_value_error", ValueError),
        ("failing_task_system_exit", SystemExit),
        ("complex_exception", ValueError),
    ],
)
def test_exceptions_are_recorded(task_name: str, exc: type[BaseException]) -> None:
    result = getattr(t, task_name).using(max_attempts=1).enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is exc
    assert exc.__name__ in result.errors[0].traceback


def test_bad_return_value_fails_without_retry() -> None:
    result = t.complex_return_value.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1 and len(result.errors) == 1
    assert result.errors[0].exception_class is TypeError
    assert "the return value of tests.tasks_backend.tasks.complex_return_value" in (
        result.errors[0].traceback
    )


def test_cancelled_is_failed_with_a_task_error() -> None:
    result = t.noop_task.enqueue()
    assert job_cancel(connection, [int(result.id)]) == {int(result.id)}
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "django_pgjobs.exceptions.JobCancelled"
    assert result.attempts == 0 and result.finished_at is not None


def test_deferred_task_waits_and_priority_orders() -> None:
    from datetime import timedelta

    later = t.noop_task.using(run_after=timedelta(hours=1)).enqueue()
    low = t.noop_task.using(priority=-10).enqueue()
    high = t.noop_task.using(priority=10).enqueue()
    normal = t.noop_task.enqueue()
    ran = [str(r.id) for r in run_jobs()]
    assert ran == [high.id, normal.id, low.id]
    later.refresh()
    assert later.status == TaskResultStatus.READY


def test_jobs_and_tasks_share_the_queue() -> None:
    job = t.plain_job.enqueue(21)
    result = t.add.enqueue(1, 2)
    drain()
    job.refresh_from_db()
    result.refresh()
    assert (job.status, job.result) == ("completed", 42)
    assert result.return_value == 3


def test_only_registered_tasks_run() -> None:
    # A row naming a function no task or @job registered is never imported: run_jobs,
    # like a worker, leaves it pending for a process that registers it.
    Job.objects.create(task="tests.tasks_backend.helpers.drain", max_attempts=3)
    drain()
    job = Job.objects.get(task="tests.tasks_backend.helpers.drain")
    assert (job.status, job.attempts, job.lease) == ("pending", 0, 0)


@pytest.mark.skipif(django.VERSION < (6, 1), reason="@task(**kwargs) pass-through is Django 6.1+")
def test_task_decorator_passes_pgjobs_options_on_61() -> None:
    assert t.fails_with_max_two.max_attempts == 2
    result = t.fails_with_max_two.enqueue()
    discarded = t.discards_key_error.enqueue()
    assert _job(result).max_attempts == 2
    drain(until=lambda: _job(result).status == "dead" and _job(discarded).status == "dead")
    assert _job(result).attempts == 2
    assert _job(discarded).attempts == 1  # discard_on: no retry


# -- signals and logs ------------------------------------------------------


@pytest.fixture
def received() -> Iterator[list[tuple[str, Any, str]]]:
    seen: list[tuple[str, Any, str]] = []

    def make(name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, sender, str(task_result.status)))

        return receiver

    receivers = {
        s: make(n)
        for s, n in (
            (task_enqueued, "enqueued"),
            (task_started, "started"),
            (task_finished, "finished"),
        )
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    yield seen
    for signal, receiver in receivers.items():
        signal.disconnect(receiver)


def test_signals_are_sent(received: list[tuple[str, Any, str]]) -> None:
    t.noop_task.enqueue()
    drain()
    assert received == [
        ("enqueued", PgJobsBackend, "READY"),
        ("started", PgJobsBackend, "RUNNING"),
        ("finished", PgJobsBackend, "SUCCESSFUL"),
    ]


def test_finished_only_once_for_a_retried_task(received: list[tuple[str, Any, str]]) -> None:
    result = t.fail_until.enqueue(2)
    drain(until=lambda: _job(result).status == "completed")
    assert [r[0] for r in received] == ["enqueued", "started", "started", "finished"]
    assert received[-1][2] == "SUCCESSFUL"


def test_log_lines_carry_the_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="django.tasks"):
        ok = t.noop_task.enqueue()
        bad = t.failing_task_value_error.using(max_attempts=1).enqueue()
        drain()
    records = [r for r in caplog.records if r.name == "django.tasks"]
    assert len(records) == 6
    assert any(
        f"id={ok.id}" in r.getMessage() and "state=SUCCESSFUL" in r.getMessage() for r in records
    )
    failed = [
        r for r in records if f"id={bad.id}" in r.getMessage() and "state=FAILED" in r.getMessage()
    ]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR
    assert failed[0].exc_info is not None and failed[0].exc_info[0] is ValueError


@pytest.mark.parametrize("signal", [task_enqueued, task_started, task_finished])
def test_raising_receiver_cannot_change_the_outcome(
    signal: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(**kwargs: Any) -> None:
        raise RuntimeError("receiver failed")

    signal.connect(boom)
    try:
        result = t.calculate_meaning_of_life.enqueue()
        drain()
    finally:
        signal.disconnect(boom)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42
    assert result.attempts == 1
    assert "receiver failed" in caplog.text


# -- a real Worker with its thread pool -------------------------------------


def test_worker_threads_run_tasks_async_tasks_and_jobs() -> None:
    results = [
        t.async_add.enqueue(1, 1),
        t.async_context.enqueue(),
        t.get_context.enqueue(),
        t.fail_until.enqueue(2),
    ]
    job = t.plain_job.enqueue(5)
    worker_ids = set()
    deadline = time.monotonic() + 20
    while _job(results[3]).status != "completed":  # burst exits while the retry backs off
        assert time.monotonic() < deadline, "timed out"
        worker = Worker(
            burst=True,
            concurrency=4,
            maintenance=False,
            listen=False,
            poll_interval=0.05,
        )
        runner = threading.Thread(target=worker.run)
        runner.start()
        runner.join(timeout=30)
        assert not runner.is_alive()
        worker_ids.add(worker.id)
        time.sleep(0.05)
    for r in results:
        r.refresh()
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 4
    assert results[0].return_value == 2
    context = results[2].return_value
    assert context["thread"] != threading.current_thread().name
    assert len(context["worker_ids"]) == 1 and context["worker_ids"][0] in worker_ids
    assert results[3].return_value == 2 and len(results[3].worker_ids) == 2
    assert set(results[3].worker_ids) <= worker_ids
    job.refresh_from_db()
    assert job.status == "completed"
