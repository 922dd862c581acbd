"""Debounce and keep-latest through the Tasks backend: ``task.using(debounce=...)`` (and,
on Django 6.1, ``@task(debounce=...)``) enqueues onto the pending job of its key."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_pgjobs.backend import TASKS_AVAILABLE

if not TASKS_AVAILABLE:
    pytest.skip(
        "django.tasks needs Django >= 6.0; only test_import runs on this Django",
        allow_module_level=True,
    )

import django
from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask

from django_pgjobs.models import Job
from tests.tasks_backend import tasks as t
from tests.tasks_backend.helpers import drain

pytestmark = pytest.mark.django_db

DEBOUNCED = t.reindex_doc.using(
    debounce=timedelta(seconds=5), debounce_key="doc:{doc_id}", max_wait=timedelta(minutes=1)
)


def test_a_debounced_task_moves_its_pending_job_on_with_the_latest_arguments() -> None:
    first = DEBOUNCED.enqueue(1, version=1)
    again = DEBOUNCED.enqueue(1, version=2)
    assert again.id == first.id and again.status == TaskResultStatus.READY
    assert again.kwargs == {"version": 2}
    job = Job.objects.get(pk=int(first.id))
    assert job.unique_key == f"pending:{job.task}:doc:1" and job.kwargs == {"version": 2}
    assert job.debounce_until - job.run_at == timedelta(seconds=55)
    assert DEBOUNCED.enqueue(2).id != first.id and Job.objects.count() == 2
    with pytest.raises(RuntimeError), transaction.atomic():
        DEBOUNCED.enqueue(1, version=3)
        raise RuntimeError("roll back")
    assert Job.objects.get(pk=int(first.id)).kwargs == {"version": 2}


@pytest.mark.django_db(transaction=True)  # now() moves on between statements: the job falls due
def test_a_debounced_task_runs_once_after_the_burst() -> None:
    soon = t.reindex_doc.using(debounce=0.1, debounce_key="doc:{doc_id}")
    ids = {soon.enqueue(3, version=n).id for n in range(5)}
    assert len(ids) == 1
    result_id = ids.pop()
    drain(until=lambda: Job.objects.get(pk=int(result_id)).status == "completed")
    assert soon.get_result(result_id).return_value == {"doc_id": 3, "version": 4}
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"debounce": 5}, "needs a debounce_key"),
        ({"debounce_key": "doc:{doc_id}"}, "need debounce"),
        ({"debounce": 30, "debounce_key": "d", "max_wait": 5}, "must be at least its debounce"),
        ({"debounce": 5, "debounce_key": "d", "keep": "newest"}, 'must be "latest" or "first"'),
        ({"debounce": 5, "debounce_key": "d", "idempotency_key": "k"}, "idempotency_key cannot"),
        ({"debounce": 5, "debounce_key": "d", "run_after": timedelta(1)}, "run_after cannot"),
    ],
)
def test_bad_debounce_options_are_invalid_tasks(options: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidTask, match=fragment):
        t.reindex_doc.using(**options).enqueue(1)  # type: ignore[arg-type]
    assert not Job.objects.exists()


@pytest.mark.skipif(django.VERSION < (6, 1), reason="@task passes extra options from 6.1")
def test_task_decorator_options_keep_the_first_arguments() -> None:
    first = t.reindex_doc_first.enqueue(4, version=1)
    assert t.reindex_doc_first.enqueue(4, version=2).id == first.id
    assert Job.objects.get(pk=int(first.id)).kwargs == {"version": 1}
