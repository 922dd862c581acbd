"""A real ``runjobs`` process runs django.tasks tasks and @job jobs from one table."""

from __future__ import annotations

import pytest

from django_pgjobs.backend import TASKS_AVAILABLE

if not TASKS_AVAILABLE:
    pytest.skip(
        "django.tasks needs Django >= 6.0; only test_import runs on this Django",
        allow_module_level=True,
    )

from collections.abc import Callable
from typing import Any

from django.tasks import TaskResultStatus

from django_pgjobs.models import Job
from tests.conftest import wait_until
from tests.tasks_backend import tasks as t

pytestmark = pytest.mark.process


def test_runjobs_runs_tasks_and_jobs(start_worker: Callable[..., Any]) -> None:
    results = [
        t.add.enqueue(2, 2),
        t.async_add.enqueue(3, 4),
        t.fail_until.enqueue(2),
        t.get_context.enqueue(),
    ]
    job = t.plain_job.enqueue(10)
    worker = start_worker("--concurrency", "4")

    def done() -> bool:
        return not Job.objects.exclude(status="completed").exists()

    wait_until(done, timeout=30, message=f"all jobs completed; worker log:\n{worker.output()}")
    for r in results:
        r.refresh()
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 4
    assert [results[0].return_value, results[1].return_value, results[2].return_value] == [4, 7, 2]
    worker_id = Job.objects.get(pk=job.id).worker
    assert results[3].return_value["worker_ids"] == [worker_id]
    assert results[2].worker_ids == [worker_id, worker_id]
    assert Job.objects.get(pk=job.id).result == 20
