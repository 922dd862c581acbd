"""The admin shows a durable job: what a waiting job waits for and until when, its
recorded steps, and the ``waiting`` status in the list's filter and the overview."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

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
