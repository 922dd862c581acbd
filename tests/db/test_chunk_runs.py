"""Chunk runs (docs/howto/chunk-handlers.md): each job that ran in a chunk records the
call its outcome came from (``Job.chunk_run``), and the job page shows that call's
size and links to its jobs.

In-process workers on the real database; the handlers record each call's job ids
(tests/chunk_jobs.py), which the recorded chunk runs must match.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_pgjobs.admin.chunk_runs import MEMBERS_SHOWN
from django_pgjobs.models import Job
from tests import chunk_jobs
from tests.chunk_jobs import calls
from tests.helpers.admin_rows import text
from tests.helpers.inprocess_worker import running_worker
from tests.testapp.jobs import add

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def call_table() -> None:
    chunk_jobs.create_calls()


def drain(until: Callable[[], Any]) -> None:
    """A worker of one job thread (so a chunk takes every due job of its task) until
    ``until()`` holds."""
    running_worker(until, queues=["chunks"], concurrency=1)


def settled(ids: list[int], *statuses: str) -> Callable[[], bool]:
    return lambda: (
        set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) <= set(statuses)
    )


def test_each_call_is_one_chunk_run_and_a_retry_records_its_new_call() -> None:
    values: list[Any] = [1, 2, "bad", 4, 5]
    ids = [chunk_jobs.doubles.enqueue(v).id for v in values]
    bad = ids[2]
    drain(settled(ids, "completed", "dead"))
    made = calls("doubles")
    assert made[0] == sorted(ids)  # the five ran in one call
    runs = dict(Job.objects.filter(id__in=ids).values_list("id", "chunk_run"))
    members: dict[Any, set[int]] = defaultdict(set)
    for job_id, run in runs.items():
        members[run].add(job_id)
    # the four that completed in the first call share one run, and only they have it
    first = runs[ids[0]]
    assert first is not None
    assert members[first] == set(ids) - {bad}
    # the bad job's last outcome (dead, after two retries each run alone) is its own run
    assert [c for c in made if bad in c][1:] == [[bad], [bad]]
    assert runs[bad] not in (None, first)
    assert members[runs[bad]] == {bad}
    # each failed attempt's error entry names the run it failed in: the first call's,
    # then two runs of its own
    named = [e.get("chunk_run") for e in Job.objects.get(id=bad).errors]
    assert named[0] == str(first) and named[-1] == str(runs[bad]) and len(set(named)) == 3


def test_a_plain_job_records_no_chunk_run() -> None:
    job = add.using(queue="chunks").enqueue(1, 2)
    drain(settled([job.id], "completed"))
    assert Job.objects.get(id=job.id).chunk_run is None


def test_the_job_page_shows_its_chunk_run_with_links_to_the_first_members(
    admin_client: Client,
) -> None:
    size = MEMBERS_SHOWN + 10
    chunk_jobs.collect.enqueue_many([(i,) for i in range(size)])
    ids = sorted(Job.objects.filter(task=chunk_jobs.collect.name).values_list("id", flat=True))
    drain(settled(ids, "completed"))
    assert calls("collect") == [ids]  # one call of all of them
    shown = ids[-1]  # past the first MEMBERS_SHOWN: linked to them, itself counted
    response = admin_client.get(reverse("admin:django_pgjobs_job_change", args=[shown]))
    assert response.status_code == 200
    page = text(response)
    assert f"{size} jobs ran in one call of the handler" in page
    assert f"and {size - MEMBERS_SHOWN} more" in page
    html = response.content.decode()
    linked = [int(i) for i in re.findall(r'href="/admin/django_pgjobs/job/(\d+)/change/"', html)]
    assert [i for i in linked if i in ids] == ids[:MEMBERS_SHOWN]
    # the first member's page marks it as this job
    first = admin_client.get(reverse("admin:django_pgjobs_job_change", args=[ids[0]]))
    assert f"#{ids[0]} (this job)" in text(first)


def test_the_page_of_a_job_that_never_ran_in_a_chunk_shows_none(admin_client: Client) -> None:
    job = chunk_jobs.collect.enqueue(1)
    response = admin_client.get(reverse("admin:django_pgjobs_job_change", args=[job.id]))
    assert response.status_code == 200
    assert "ran in one call of the handler" not in text(response)
