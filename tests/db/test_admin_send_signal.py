"""The job list's "Send a signal" action: a form for the ticked jobs, then a signal to
each (a waiting job wakes), a finished job named and skipped, a bad payload refused
before any row, and the change permission required."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_pgjobs.models import Job, JobSignal
from django_pgjobs.testing import run_jobs
from tests import signal_jobs

pytestmark = pytest.mark.django_db

LIST = "admin:django_pgjobs_job_changelist"


def _post(client: Client, ids: list[int], **fields: str) -> Any:
    data = {
        "action": "send_signal_action",
        "_selected_action": [str(i) for i in ids],
        "index": "0",
        **fields,
    }
    return client.post(reverse(LIST), data, follow=True)


def test_the_action_asks_for_the_signal_then_sends_it_and_wakes_the_job(
    admin_client: Client,
) -> None:
    waiting = signal_jobs.approval.enqueue()
    run_jobs()
    done = signal_jobs.approval.enqueue()
    Job.objects.filter(id=done.id).update(status="completed", finished_at=timezone.now())
    form = _post(admin_client, [waiting.id, done.id])
    assert form.status_code == 200
    assert 'name="payload"' in form.content.decode() and not JobSignal.objects.exists()
    page = _post(
        admin_client,
        [waiting.id, done.id],
        send="1",
        name="approval",
        payload='{"ok": true}',
        idempotency_key="admin-1",
    )
    text = [str(m) for m in page.context["messages"]]
    assert text == [
        f"Sent signal 'approval' to 1 job(s); refused 1 (#{done.id}: send_signal: job "
        f"{done.id} is completed; a finished job takes no signals (retry it first if it "
        "must go on))."
    ]
    assert Job.objects.get(id=waiting.id).status == "pending"
    [ran] = run_jobs()
    assert ran.value == {"answer": {"ok": True}}


def test_a_bad_payload_is_refused_on_the_form_and_nothing_is_sent(admin_client: Client) -> None:
    job = signal_jobs.approval.enqueue()
    page = _post(admin_client, [job.id], send="1", name="approval", payload="{not json")
    assert page.status_code == 200
    assert "not a payload" in page.content.decode()
    assert not JobSignal.objects.exists()


def test_sending_needs_the_change_permission(client: Client, django_user_model: Any) -> None:
    job = signal_jobs.approval.enqueue()
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(viewer)
    _post(client, [job.id], send="1", name="approval", payload="1")
    assert not JobSignal.objects.exists()


def test_a_job_waiting_for_an_event_says_which_on_its_page(admin_client: Client) -> None:
    job = signal_jobs.paid.enqueue("42")
    run_jobs()
    page = admin_client.get(reverse("admin:django_pgjobs_job_change", args=[job.id]))
    text = page.content.decode()
    assert "event <code>invoice.paid</code> key <code>42</code> (until " in text
