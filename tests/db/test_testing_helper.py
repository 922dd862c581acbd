"""``django_pgjobs.testing.run_jobs``: drain due jobs in the test's own process."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from django.db import connection

from django_pgjobs import pause_queue, resume_queue, signals
from django_pgjobs.models import Job, Queue
from django_pgjobs.testing import RanJob, run_jobs
from tests.helpers.rows import make_job, snapshot
from tests.testapp import jobs

pytestmark = pytest.mark.django_db  # inside a TestCase-style transaction, like users' tests


def test_runs_due_jobs_in_claim_order_and_returns_what_ran() -> None:
    low = jobs.add.using(priority=-1).enqueue(1, 1)
    high = jobs.add.using(priority=9).enqueue(2, 2)
    email = jobs.send_email.enqueue("a@b.c")
    later = jobs.add.using(delay=3600).enqueue(3, 3)
    ran = run_jobs()
    assert ran == [
        RanJob(high.id, "tests.testapp.jobs.add", "completed", 4),
        RanJob(
            email.id, "tests.testapp.jobs.send_email", "completed", {"to": "a@b.c", "subject": "hi"}
        ),
        RanJob(low.id, "tests.testapp.jobs.add", "completed", 2),
    ]  # across queues by priority: 9 (default), 5 (emails), -1 (default)
    assert {j.id: j.status for j in Job.objects.all()} == {
        high.id: "completed",
        low.id: "completed",
        email.id: "completed",
        later.id: "pending",
    }
    assert run_jobs() == []


def test_runs_in_the_calling_thread() -> None:
    seen: list[int] = []

    def on_started(**kwargs: Any) -> None:
        seen.append(threading.get_ident())

    signals.job_started.connect(on_started)
    try:
        jobs.noop.enqueue()
        assert len(run_jobs()) == 1
    finally:
        signals.job_started.disconnect(on_started)
    assert seen == [threading.get_ident()]


def test_queues_and_max_jobs() -> None:
    email = jobs.send_email.enqueue("a@b.c")
    for _ in range(3):
        jobs.noop.enqueue()
    assert [r.id for r in run_jobs(queues=["emails"])] == [email.id]
    assert len(run_jobs(max_jobs=2)) == 2
    assert len(run_jobs()) == 1


def test_failures_are_retried_later_or_dead_lettered() -> None:
    retry = jobs.always_fails.enqueue("again")
    dead = jobs.always_fails.using(max_attempts=1).enqueue("final")
    ran = {r.id: r for r in run_jobs()}
    assert ran[retry.id].status == "pending" and ran[retry.id].error["message"] == "again"
    assert ran[dead.id].status == "dead"
    retry.refresh_from_db()
    assert retry.status == "pending" and retry.attempts == 1 and len(retry.errors) == 1
    # Within one test transaction now() stands still, so the backoff is never over.
    assert run_jobs() == []


def test_unknown_task_and_atomic_jobs(caplog: pytest.LogCaptureFixture) -> None:
    unknown = jobs.noop.enqueue()
    Job.objects.filter(id=unknown.id).update(task="gone.away")
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE th_atomic (job_id bigint, lease bigint)")
    atomic = jobs.atomic_insert.enqueue("th_atomic", 0)
    before = snapshot(unknown.id)
    with caplog.at_level(logging.WARNING, logger="django_pgjobs"):
        ran = {r.id: r for r in run_jobs()}
    assert [r.getMessage() for r in caplog.records if "unregistered" in r.getMessage()] == [
        "run_jobs left due jobs of unregistered task(s) pending: 'gone.away' (import their "
        "module in the test, or list it in PGJOBS['JOB_MODULES'])"
    ]
    assert unknown.id not in ran, "an unknown task is left for a worker that knows it"
    assert snapshot(unknown.id) == before, "not even claimed and given back"
    assert ran[atomic.id] == RanJob(atomic.id, "tests.testapp.jobs.atomic_insert", "completed", 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id FROM th_atomic")
        assert cursor.fetchall() == [(atomic.id,)]


def test_a_paused_queue_is_not_drained_until_resumed() -> None:
    email = jobs.send_email.enqueue("a@b.c")
    other = jobs.noop.enqueue()
    pause_queue("emails")
    assert [r.id for r in run_jobs()] == [other.id]
    assert run_jobs(queues=["emails"]) == []
    assert Job.objects.get(id=email.id).status == "pending"
    resume_queue("emails")
    assert [r.id for r in run_jobs()] == [email.id]


def test_max_running_and_rate_hold_as_for_a_worker() -> None:
    Queue.objects.create(name="emails", max_running=1)
    busy = make_job("running", task="tests.testapp.jobs.send_email", args=["x@b.c"], queue="emails")
    waiting = jobs.send_email.enqueue("a@b.c")
    assert run_jobs(queues=["emails"]) == [], "the queue's one slot is taken"
    Job.objects.filter(id=busy.id).update(status="cancelled", finished_at=busy.started_at)
    assert [r.id for r in run_jobs(queues=["emails"])] == [waiting.id]

    Queue.objects.create(name="default", rate="2/h")
    for _ in range(3):
        jobs.noop.enqueue()
    assert len(run_jobs(queues=["default"])) == 2, "2 starts per hour"
    assert Job.objects.filter(queue="default", status="pending").count() == 1
