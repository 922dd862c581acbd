"""Error paths of the Tasks backend: signals
follow the database, naive datetimes agree, rows never pick what is imported."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from django_pgjobs.backend import TASKS_AVAILABLE

if not TASKS_AVAILABLE:
    pytest.skip("django.tasks needs Django >= 6.0", allow_module_level=True)

from django.db import connection
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgjobs.models import Job
from tests.tasks_backend import tasks as t
from tests.tasks_backend.helpers import drain

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished() -> Iterator[list[tuple[str, str, str | None]]]:
    """(result id, status sent, the row's status when the receiver ran)."""
    seen: list[tuple[str, str, str | None]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        row = Job.objects.filter(pk=int(task_result.id)).values_list("status", flat=True).first()
        seen.append((task_result.id, str(task_result.status), row))

    task_finished.connect(receiver)
    yield seen
    task_finished.disconnect(receiver)


def test_success_is_announced_after_the_completion_is_written(finished: list[Any]) -> None:
    result = t.calculate_meaning_of_life.enqueue()
    drain()
    assert finished == [(result.id, "SUCCESSFUL", "completed")]


def test_failure_is_announced_once_after_the_dead_letter(finished: list[Any]) -> None:
    result = t.failing_task_value_error.using(max_attempts=2).enqueue()
    drain(lambda: Job.objects.filter(pk=int(result.id), status="dead").exists())
    assert finished == [(result.id, "FAILED", "dead")]


def test_a_fenced_attempt_announces_nothing(finished: list[Any]) -> None:
    result = t.loses_its_lease.enqueue()
    drain()
    assert Job.objects.get(pk=int(result.id)).status == "running"  # the write was refused
    assert finished == []


def test_an_existing_idempotency_key_sends_no_task_enqueued() -> None:
    sent: list[str] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        first = t.noop_task.using(idempotency_key="sig-once").enqueue()
        again = t.noop_task.using(idempotency_key="sig-once").enqueue()
    finally:
        task_enqueued.disconnect(receiver)
    assert again.id == first.id
    assert sent == [first.id]


def test_refresh_of_a_successful_result_is_one_query() -> None:
    result = t.echo.enqueue(1, x=2)
    drain()
    with CaptureQueriesContext(connection) as queries:
        result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"args": [1], "kwargs": {"x": 2}}
    assert len(queries) == 1, [q["sql"] for q in queries]


def test_reading_a_result_never_imports_the_task_named_by_the_row() -> None:
    module = "tests.tasks_backend.unregistered_tasks"
    assert module not in sys.modules
    job = Job.objects.create(task=f"{module}.never_imported", args=[], kwargs={})
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(job.id))
    assert module not in sys.modules


@override_settings(USE_TZ=False)
def test_naive_datetimes_agree_between_enqueue_and_get_result() -> None:
    result = t.noop_task.using(run_after=timedelta(minutes=5)).enqueue()
    fetched = t.noop_task.get_result(result.id)
    assert result == fetched
    run_after = result.task.run_after
    for value in (result.enqueued_at, run_after):
        assert isinstance(value, datetime) and timezone.is_naive(value)
    assert result.enqueued_at <= timezone.now() < run_after  # type: ignore[operator]
    assert fetched.enqueued_at == result.enqueued_at
    assert fetched.task.run_after == run_after


@override_settings(USE_TZ=False)
def test_naive_datetimes_of_a_failed_result_compare_with_now() -> None:
    result = t.failing_task_value_error.using(max_attempts=1).enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    now = timezone.now()
    for value in (
        result.enqueued_at,
        result.started_at,
        result.finished_at,
        result.last_attempted_at,
    ):
        assert value is not None and timezone.is_naive(value) and value <= now
