"""Admin actions: retry now, cancel, reap stuck now.

Each action must change exactly the rows whose state allows it, refuse rows
whose state moved on (and say so), bump the lease so the worker that held a job
is fenced, and never call ``Job.save()``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_pgjobs import JobContext, claim, job
from django_pgjobs.conf import get_settings
from django_pgjobs.db.job_admin import job_retry_now
from django_pgjobs.db.job_outcome import job_complete_many, job_heartbeat
from django_pgjobs.models import Job, JobResult
from django_pgjobs.testing import run_jobs
from django_pgjobs.worker.loop import Worker
from tests.conftest import wait_until
from tests.helpers.admin_rows import (
    REAP,
    cancelled,
    changelist_url,
    completed,
    dead,
    keep_fresh,
    messages_of,
    pending,
    post_action,
    running,
    wait_stuck,
)
from tests.testapp.jobs import add, flaky_until

pytestmark = pytest.mark.django_db(transaction=True)

saw_cancel = threading.Event()


@job(takes_context=True, max_attempts=1, queue="cancel-me")
def waits_for_cancel(context: JobContext, seconds: float) -> str:
    """Polls ``is_cancelled()`` like a well-behaved long job."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if context.is_cancelled():
            saw_cancel.set()
            return "stopped early"
        time.sleep(0.05)
    return "ran to the end"


def _snapshot(*jobs: Job) -> dict[int, tuple[str, int, int]]:
    return {
        j.id: (j.status, j.lease, j.attempts)
        for j in Job.objects.filter(id__in=[x.id for x in jobs])
    }


def test_retry_now_changes_dead_cancelled_and_stuck_and_skips_the_rest(
    admin_client: Client,
) -> None:
    failed = dead(message="first failure")
    gone = cancelled()
    stuck = running("reports")
    wait_stuck(stuck)
    fresh = running("emails")
    done = completed()
    waiting = pending("later", delay=3600)
    before = _snapshot(failed, gone, stuck, fresh, done, waiting)
    keep_fresh(fresh)

    response = post_action(
        admin_client, "retry_now", [failed.id, gone.id, stuck.id, fresh.id, done.id, waiting.id]
    )

    [message] = messages_of(response)
    assert message.startswith("Retried 3 jobs; skipped 3 whose state had moved on ("), message
    for j, status in ((fresh, "running"), (done, "completed"), (waiting, "pending")):
        assert f"#{j.id} is {status}" in message
    after = _snapshot(failed, gone, stuck, fresh, done, waiting)
    for j in (failed, gone, stuck):
        status, lease, attempts = after[j.id]
        assert (status, attempts) == ("pending", 0)
        assert lease == before[j.id][1] + 1, "lease bumped: the old holder is fenced"
    for j in (fresh, done, waiting):
        assert after[j.id] == before[j.id], "skipped rows are untouched"
    retried = Job.objects.get(id=failed.id)
    assert retried.finished_at is None and retried.run_at <= retried.created_at.now(
        retried.created_at.tzinfo
    )
    assert [e["message"] for e in retried.errors] == ["first failure"], "error history kept"
    assert retried.last_error == "builtins.ValueError: first failure"
    # The stuck job's lost worker can no longer complete it.
    assert job_complete_many(connection, [(stuck.id, stuck.lease, "late")]) == set()
    assert Job.objects.get(id=stuck.id).status == "pending"


def test_retried_dead_job_runs_again_and_completes(admin_client: Client, tmp_path: Path) -> None:
    marker = str(tmp_path / "runs")
    job_row = flaky_until.using(max_attempts=1).enqueue(marker, 2)
    assert [r.status for r in run_jobs()] == ["dead"]
    post_action(admin_client, "retry_now", [job_row.id])
    assert [r.status for r in run_jobs()] == ["completed"]
    finished = Job.objects.get(id=job_row.id)
    assert (finished.status, finished.attempts, len(finished.errors)) == ("completed", 1, 1)


def test_retry_refuses_a_job_whose_state_moved_on(admin_client: Client, tmp_path: Path) -> None:
    """Two operators look at the same dead job; the second click must do nothing."""
    job_row = flaky_until.using(max_attempts=1).enqueue(str(tmp_path / "runs"), 2)
    run_jobs()
    # The admin page lists the job as dead...
    assert job_row.id in [
        j.id for j in admin_client.get(changelist_url(attention="dead")).context["cl"].result_list
    ]
    # ...meanwhile someone else retries it and a worker completes it.
    assert job_retry_now(
        connection, [job_row.id], stale_after=get_settings().STALE_AFTER
    ).changed == {job_row.id}
    run_jobs()
    before = _snapshot(job_row)
    response = post_action(
        admin_client, "retry_now", [job_row.id], url=changelist_url(attention="dead")
    )
    assert messages_of(response) == [
        f"Retried 0 jobs; skipped 1 whose state had moved on (#{job_row.id} is completed)."
    ]
    assert _snapshot(job_row) == before
    assert JobResult.objects.filter(job_id=job_row.id).exists()


def test_cancel_changes_pending_and_running_only(admin_client: Client) -> None:
    failed = dead()
    done = completed("other")
    waiting = pending()
    busy = running("emails")
    before = _snapshot(waiting, busy, failed, done)
    response = post_action(admin_client, "cancel_jobs", [waiting.id, busy.id, failed.id, done.id])
    [message] = messages_of(response)
    assert message.startswith("Cancelled 2 jobs; skipped 2 whose state had moved on ("), message
    after = _snapshot(waiting, busy, failed, done)
    for j in (waiting, busy):
        assert after[j.id][:2] == ("cancelled", before[j.id][1] + 1)
        assert Job.objects.get(id=j.id).finished_at is not None
    assert after[failed.id] == before[failed.id] and after[done.id] == before[done.id]
    # The worker that held the running job is fenced: heartbeat reports it lost and
    # its completion changes nothing.
    assert job_heartbeat(connection, [(busy.id, busy.lease)]) == {busy.id}
    assert job_complete_many(connection, [(busy.id, busy.lease, 1)]) == set()
    assert Job.objects.get(id=busy.id).status == "cancelled"


def test_cancelling_a_running_job_reaches_its_context(admin_client: Client) -> None:
    """A real worker (in-process threads): cancel -> is_cancelled() -> result rejected."""
    saw_cancel.clear()
    job_row = waits_for_cancel.enqueue(30.0)
    worker = Worker(
        queues=["cancel-me"],
        concurrency=1,
        burst=True,
        maintenance=False,
        listen=False,
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: Job.objects.get(id=job_row.id).status == "running",
            message="the worker to claim the job",
        )
        response = post_action(admin_client, "cancel_jobs", [job_row.id])
        assert messages_of(response) == ["Cancelled 1 job."]
        assert saw_cancel.wait(timeout=10), "JobContext.is_cancelled() never turned true"
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()
    row = Job.objects.get(id=job_row.id)
    assert row.status == "cancelled"
    assert not JobResult.objects.filter(job_id=job_row.id).exists(), "late result rejected"
    assert worker.counts["fenced"] == 1


def test_retry_all_matching_a_filter(admin_client: Client) -> None:
    failures = [dead(queue="emails") for _ in range(3)]
    done = completed()
    response = admin_client.post(
        changelist_url(attention="dead"),
        {
            "action": "retry_now",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(failures[0].id)],
        },
        follow=True,
    )
    assert messages_of(response) == ["Retried 3 jobs."]
    assert {j.status for j in Job.objects.filter(id__in=[f.id for f in failures])} == {"pending"}
    assert Job.objects.get(id=done.id).status == "completed"


def test_reap_stuck_now(admin_client: Client) -> None:
    with_attempts_left = running("reports")
    add.using(queue="last", max_attempts=1).enqueue(1, 1)
    [last_try] = claim.claim(connection, worker="admin-test-worker", queues=["last"], n=1)
    # A suspect whose worker was lost once before while it ran alone, with the attempt
    # given back: no more of that (losses among neighbours are always refunded).
    Job.objects.filter(id=last_try.id).update(
        errors=[
            {"type": "django_pgjobs.exceptions.WorkerLost", "refunded": True, "isolated": True}
        ],
        suspect=True,
    )
    wait_stuck(with_attempts_left, Job.objects.get(id=last_try.id))
    fresh = running("emails")
    keep_fresh(fresh)
    assert admin_client.get(reverse(REAP)).status_code == 405
    response = admin_client.post(
        reverse(REAP), {"next": changelist_url(attention="stuck")}, follow=True
    )
    assert response.redirect_chain[-1][0] == changelist_url(attention="stuck")
    assert messages_of(response) == [
        "Reaped 2 stuck jobs: 1 back to pending, 1 dead-lettered (no attempts left)."
    ]
    assert Job.objects.get(id=with_attempts_left.id).status == "pending"
    reaped_dead = Job.objects.get(id=last_try.id)
    assert reaped_dead.status == "dead" and "worker lost" in (reaped_dead.last_error or "")
    assert Job.objects.get(id=fresh.id).status == "running"
    assert list(response.context["cl"].result_list) == []


def test_actions_never_save_model_instances(admin_client: Client, monkeypatch: Any) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Job.save() was called by the admin")

    failed = dead()
    waiting = pending()
    monkeypatch.setattr(Job, "save", refuse)
    post_action(admin_client, "retry_now", [failed.id])
    post_action(admin_client, "cancel_jobs", [waiting.id])
    assert Job.objects.get(id=failed.id).status == "pending"
    assert Job.objects.get(id=waiting.id).status == "cancelled"
