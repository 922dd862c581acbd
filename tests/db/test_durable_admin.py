"""The admin shows a durable job: what a waiting job waits for and until when, its
recorded steps, and the ``waiting`` status in the list's filter and the overview."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from tests import durable_jobs

pytestmark = pytest.mark.django_db


def test_a_waiting_jobs_page_says_what_it_waits_for_and_lists_its_steps(
    admin_client: Client,
) -> None:
    durable_jobs.CALLS.clear()
    job = durable_jobs.three_steps.enqueue(41)
    run_jobs()
    page = admin_client.get(reverse("admin:django_pgjobs_job_change", args=[job.id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "sleep <code>nap</code>" in text and "until " in text
    assert "<code>a</code>" in text and "<code>42</code>" in text  # step a's result
    assert "<code>nap</code></td>" in text  # the sleep is a recorded step too


def test_the_list_filters_waiting_jobs_and_the_overview_counts_them(
    admin_client: Client,
) -> None:
    job = durable_jobs.three_steps.enqueue(1)
    durable_jobs.many_steps.enqueue(1)
    run_jobs()
    listing = admin_client.get(reverse("admin:django_pgjobs_job_changelist") + "?status=waiting")
    assert listing.status_code == 200
    assert [j.id for j in listing.context["cl"].result_list] == [job.id]
    overview = admin_client.get(reverse("admin:django_pgjobs_job_overview"))
    assert overview.status_code == 200
    row = next(r for r in overview.context["queue_rows"] if r["q"].queue == "durable")
    assert row["q"].waiting == 1


def test_wake_now_ends_a_sleep_and_the_next_run_passes_it(admin_client: Client) -> None:
    durable_jobs.CALLS.clear()
    job = durable_jobs.three_steps.enqueue(1)
    other = durable_jobs.many_steps.enqueue(1)
    run_jobs()
    response = admin_client.post(
        reverse("admin:django_pgjobs_job_changelist"),
        {"action": "wake_now", "_selected_action": [str(job.id), str(other.id)], "index": "0"},
        follow=True,
    )
    messages = [str(m) for m in response.context["messages"]]
    assert messages == [
        f"Woke 1 job; skipped 1 whose state had moved on (#{other.id} is completed)."
    ]
    assert Job.objects.get(id=job.id).status == "pending"
    [ran] = run_jobs()  # no clock moved: the wake ended the hour's sleep
    assert (ran.id, ran.status, ran.value) == (job.id, "completed", [2, 20])
    assert durable_jobs.CALLS == ["a", "tick", "b"]  # "a" was not called again


def test_wake_now_needs_the_change_permission(client: Client, django_user_model: Any) -> None:
    job = durable_jobs.three_steps.enqueue(1)
    run_jobs()
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(viewer)
    client.post(
        reverse("admin:django_pgjobs_job_changelist"),
        {"action": "wake_now", "_selected_action": [str(job.id)], "index": "0"},
    )
    assert Job.objects.get(id=job.id).status == "waiting"
