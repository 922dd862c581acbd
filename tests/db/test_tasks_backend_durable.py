"""``django_pgjobs.durable(context)``: a Django task's durable steps and sleeps."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_pgjobs.backend import TASKS_AVAILABLE

if not TASKS_AVAILABLE:
    pytest.skip("django.tasks needs Django >= 6.0", allow_module_level=True)

from django.tasks import TaskResultStatus

import django_pgjobs
from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from tests.tasks_backend import tasks as t

pytestmark = pytest.mark.django_db


def test_a_task_sleeps_as_waiting_and_its_steps_are_not_run_again() -> None:
    t.DURABLE_CALLS.clear()
    result = t.durable_task.enqueue(1)
    [ran] = run_jobs()
    assert ran.status == "waiting"
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING  # started, not finished
    [ran] = run_jobs(advance=timedelta(hours=1))
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == [2, 4]
    assert t.DURABLE_CALLS == ["first", "second"]
    assert Job.objects.get(pk=int(result.id)).status == "completed"


def test_a_task_waits_for_a_signal_holding_no_worker_and_takes_it_once() -> None:
    result = t.approval_task.enqueue()
    [ran] = run_jobs()
    assert ran.status == "waiting"
    django_pgjobs.send_signal(int(result.id), "approval", {"ok": True})
    [ran] = run_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value is True


def test_durable_outside_a_running_task_says_where_it_works() -> None:
    with pytest.raises(RuntimeError, match="inside a task that a django-pgjobs worker runs"):
        django_pgjobs.durable(object())
