"""Enqueue, get_result and validation: Django's TaskTestCase shape on a database backend."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest

from django_pgjobs.backend import TASKS_AVAILABLE

if not TASKS_AVAILABLE:
    pytest.skip(
        "django.tasks needs Django >= 6.0; only test_import runs on this Django",
        allow_module_level=True,
    )

from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.exceptions import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)
from django.test import override_settings
from django.utils import timezone

from django_pgjobs.backend import PgJobsBackend, PgJobsTask
from django_pgjobs.models import Job
from tests.tasks_backend import tasks as t

pytestmark = pytest.mark.django_db


def _count() -> int:
    return Job.objects.count()


# -- the decorator and the backend ---------------------------------------------


def test_task_class_and_flags() -> None:
    assert isinstance(task_backends["default"], PgJobsBackend)
    assert isinstance(t.noop_task, PgJobsTask)
    assert isinstance(t.noop_task_from_bare_decorator, PgJobsTask)
    assert t.noop_task.module_path == "tests.tasks_backend.tasks.noop_task"
    assert t.always_fails.get_backend().options == {"max_attempts": 3}


# -- enqueue ---------------------------------------------------------------


def test_enqueue_task() -> None:
    result = t.noop_task.enqueue()
    assert isinstance(result.id, str) and result.id.isdigit() and len(result.id) < 64
    assert result.status == TaskResultStatus.READY
    assert result.task == t.noop_task
    assert result.args == [] and result.kwargs == {}
    assert result.backend == "default"
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    assert result.enqueued_at is not None
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    assert not result.is_finished
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value
    job = Job.objects.get(pk=int(result.id))
    assert (job.task, job.queue, job.priority, job.status) == (
        t.noop_task.module_path,
        "default",
        0,
        "pending",
    )


def test_enqueue_async_task_and_aenqueue() -> None:
    result = t.noop_task_async.enqueue()
    assert result.status == TaskResultStatus.READY
    result2 = async_to_sync(t.noop_task.aenqueue)(1, two=2)
    assert result2.args == [1] and result2.kwargs == {"two": 2}
    assert async_to_sync(t.noop_task.aget_result)(result2.id) == result2
    assert _count() == 2


def test_enqueue_equals_get_result() -> None:
    run_after = timezone.now() + timedelta(hours=1)
    for result in (
        t.echo.enqueue(1, "two", [3], {"four": 4}, x=(5, 6)),
        t.echo.using(priority=10, queue_name="queue_1", run_after=run_after).enqueue(),
        t.echo.using(run_after=timezone.now() - timedelta(minutes=1)).enqueue(),
        t.echo.using(max_attempts=9, idempotency_key="k-1").enqueue(),
    ):
        assert t.echo.get_result(result.id) == result
        assert default_task_backend.get_result(result.id) == result


def test_arguments_round_trip_as_json() -> None:
    result = t.echo.enqueue((1, 2), {1: "int key"}, b"bytes", nested={"t": (3,)})
    # tuples become lists and keys strings, in the returned and in the stored copy alike
    assert result.args == [[1, 2], {"1": "int key"}, "bytes"]
    assert result.kwargs == {"nested": {"t": [3]}}
    assert t.echo.get_result(result.id).args == result.args


@pytest.mark.parametrize("bad", [datetime.now(), {1, 2}, object(), float("nan")])
def test_invalid_arguments_write_nothing(bad: object) -> None:
    with pytest.raises(
        TypeError, match=re.escape("positional argument 0 of tests.tasks_backend.tasks.echo")
    ):
        t.echo.enqueue(bad)
    with pytest.raises(TypeError, match="argument 'key' of"):
        t.echo.enqueue(key=bad)
    assert _count() == 0


def test_unsupported_type_message_is_djangos() -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        t.echo.enqueue(datetime.now())


def test_wrong_arity_is_refused_at_enqueue() -> None:
    with pytest.raises(TypeError, match=r"add\(\): missing a required argument: 'b'"):
        t.add.enqueue(1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        t.add.enqueue(1, 2, c=3)
    assert _count() == 0


def test_using_variants_and_chaining() -> None:
    run_after = timezone.now() + timedelta(minutes=5)
    derived = t.noop_task.using(priority=50).using(queue_name="queue_1").using(run_after=run_after)
    assert (derived.priority, derived.queue_name, derived.run_after) == (50, "queue_1", run_after)
    assert t.noop_task.priority == 0  # the original is unchanged
    result = derived.enqueue()
    job = Job.objects.get(pk=int(result.id))
    assert (job.priority, job.queue, job.run_at) == (50, "queue_1", run_after)
    assert result.task.run_after == run_after


def test_run_after_timedelta() -> None:
    before = timezone.now()
    result = t.noop_task.using(run_after=timedelta(hours=2)).enqueue()
    job = Job.objects.get(pk=int(result.id))
    assert before + timedelta(hours=2) <= job.run_at <= timezone.now() + timedelta(hours=2)
    assert result.task.run_after == job.run_at


def test_priority_keeps_djangos_direction() -> None:
    result = t.noop_task.using(priority=100).enqueue()
    assert Job.objects.get(pk=int(result.id)).priority == 100  # higher runs first, as stored


def test_per_call_pgjobs_options() -> None:
    first = t.noop_task.using(idempotency_key="once", max_attempts=7).enqueue()
    again = t.noop_task.using(idempotency_key="once", max_attempts=7).enqueue()
    assert again.id == first.id and _count() == 1
    job = Job.objects.get(pk=int(first.id))
    assert (job.max_attempts, job.idempotency_key) == (7, "once")
    assert first.task.max_attempts == 7


def test_backend_options_default_max_attempts() -> None:
    result = t.always_fails.enqueue()
    assert Job.objects.get(pk=int(result.id)).max_attempts == 3
    assert result.task.max_attempts is None  # the default, not an override
    assert t.noop_task.enqueue().task.max_attempts is None


# -- validation: Django's rules and messages, then ours ----------------------------


def _local() -> None:
    pass


def test_module_level_function_required() -> None:
    def inner() -> None:
        pass

    for func in (inner, lambda: None):
        with pytest.raises(
            InvalidTask, match=re.escape("Task function must be defined at a module level.")
        ):
            task()(func)


def test_takes_context_needs_context_argument() -> None:
    with pytest.raises(
        InvalidTask,
        match=re.escape("Task takes context but does not have a first argument of 'context'."),
    ):
        task(takes_context=True)(t.add.func)


@pytest.mark.parametrize("priority", [-101, 101, 1.5])
def test_priority_bounds(priority: float) -> None:
    with pytest.raises(
        InvalidTask, match=re.escape("priority must be a whole number between -100 and 100.")
    ):
        t.noop_task.using(priority=priority)  # type: ignore[arg-type]


def test_priority_limits_accepted() -> None:
    assert t.noop_task.using(priority=-100).priority == -100
    assert t.noop_task.using(priority=100).priority == 100


def test_naive_run_after() -> None:
    with pytest.raises(InvalidTask, match=re.escape("run_after must be an aware datetime.")):
        t.noop_task.using(run_after=datetime.now())


def test_negative_timedelta_run_after() -> None:
    with pytest.raises(InvalidTask, match="negative timedelta"):
        t.noop_task.using(run_after=timedelta(seconds=-1))


def test_unknown_queue() -> None:
    with pytest.raises(InvalidTask, match=re.escape("Queue 'nope' is not valid for backend.")):
        t.noop_task.using(queue_name="nope")


def test_our_queue_rules_on_an_open_backend() -> None:
    with pytest.raises(InvalidTask, match="queue must not contain commas"):
        t.always_fails.using(queue_name="a,b")
    with pytest.raises(InvalidTask, match="at most 100 characters"):
        t.always_fails.using(queue_name="q" * 101)


def test_our_option_rules() -> None:
    with pytest.raises(InvalidTask, match="max_attempts must be a whole number from 1 to 1000"):
        t.noop_task.using(max_attempts=0)
    with pytest.raises(InvalidTask, match="idempotency_key must be a non-empty string"):
        t.noop_task.using(idempotency_key="x" * 300)
    with pytest.raises(InvalidTask, match="retry_on takes exception classes"):
        PgJobsTask(
            func=t.add.func,
            priority=0,
            backend="default",
            queue_name="default",
            run_after=None,
            retry_on=("nope",),
        )  # type: ignore[arg-type]


def test_unknown_backend_alias() -> None:
    with pytest.raises(
        InvalidTaskBackend, match=re.escape("The connection 'missing' doesn't exist.")
    ):
        t.noop_task.using(backend="missing")


def test_validate_on_enqueue_writes_nothing() -> None:
    task_ = t.noop_task.using(queue_name="queue_1")
    with override_settings(TASKS={"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend"}}):
        with pytest.raises(
            InvalidTask, match=re.escape("Queue 'queue_1' is not valid for backend.")
        ):
            task_.enqueue()
        with pytest.raises(InvalidTask):
            async_to_sync(task_.aenqueue)()
    assert _count() == 0


# -- get_result -----------------------------------------------------------


@pytest.mark.parametrize(
    "bad_id", ["abc", "123", 123, "", "-1", "1.5", "99999999999999999999", " 1", "\u0661"]
)
def test_get_result_missing_or_malformed(bad_id: object) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(bad_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)(bad_id)


def test_get_result_of_a_job_is_not_a_task_result() -> None:
    job = t.plain_job.enqueue(3)
    with pytest.raises(TaskResultDoesNotExist, match=re.escape("not a django.tasks task")):
        default_task_backend.get_result(str(job.id))


def test_get_result_mismatch() -> None:
    result = t.noop_task.enqueue()
    with pytest.raises(
        TaskResultMismatch,
        match=re.escape("Task does not match (received 'tests.tasks_backend.tasks.noop_task')"),
    ):
        t.calculate_meaning_of_life.get_result(result.id)
    with pytest.raises(TaskResultMismatch):
        async_to_sync(t.calculate_meaning_of_life.aget_result)(result.id)


def test_get_result_from_another_alias_of_ours() -> None:
    result = t.noop_task.enqueue()
    other = task_backends["retrying"].get_result(result.id)
    assert other.id == result.id and other.backend == "retrying"


def test_refresh() -> None:
    result = t.calculate_meaning_of_life.enqueue()
    Job.objects.filter(pk=int(result.id)).update(priority=5)  # refresh keeps the task
    result.refresh()
    assert result.status == TaskResultStatus.READY
    async_to_sync(result.arefresh)()
    assert result.task == t.calculate_meaning_of_life
