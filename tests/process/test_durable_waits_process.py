"""Waits under a real ``runjobs`` process whose poll is 30 s, so only the NOTIFY of a
commit wakes it in time: a signal's commit and an event's commit each get their
waiting job claimed within a second; an async job's wait too."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from django.db import transaction

from django_pgjobs import emit_event, send_signal
from django_pgjobs.models import Job
from tests import signal_jobs
from tests.conftest import WorkerProcess, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Start = Callable[..., WorkerProcess]

#: The promise: a worker claims a woken job within this of the wake's commit.
CLAIM_DEADLINE = 1.0
#: The worker's safety-net poll, far longer than the promise.
POLL = {"PGJOBS_TEST_POLL_INTERVAL": "30"}


def _status(job_id: int) -> str:
    return str(Job.objects.get(id=job_id).status)


def _wait_status(job_id: int, *statuses: str, timeout: float = 30) -> float:
    """Wait until the job has one of ``statuses``; the monotonic time it was seen."""
    wait_until(
        lambda: _status(job_id) in statuses,
        timeout=timeout,
        interval=0.01,
        message=f"job {job_id} to be {'/'.join(statuses)}",
    )
    return time.monotonic()


def _claimed_after(job_id: int, wake: Callable[[], None]) -> float:
    """Seconds from the wake's commit until the job left pending (claimed)."""
    assert _status(job_id) == "waiting"
    with transaction.atomic():
        wake()
    committed = time.monotonic()
    seen = _wait_status(job_id, "running", "completed", timeout=20)
    return seen - committed


def test_a_signal_commit_wakes_its_waiting_job_through_notify(start_worker: Start) -> None:
    start_worker("--queues", "durable", "--concurrency", "2", env=POLL)
    job = signal_jobs.approval.enqueue()
    _wait_status(job.id, "waiting")
    # Past the worker's first idle poll, so only a NOTIFY can wake it in time.
    time.sleep(0.5)
    elapsed = _claimed_after(job.id, lambda: send_signal(job.id, "approval", "go"))
    _wait_status(job.id, "completed")
    assert Job.objects.get(id=job.id).result == {"answer": "go"}
    assert elapsed < CLAIM_DEADLINE, f"claimed {elapsed:.3f}s after the signal's commit"


def test_an_event_commit_wakes_every_waiting_job_through_notify(start_worker: Start) -> None:
    start_worker("--queues", "durable", "--concurrency", "4", env=POLL)
    jobs = [signal_jobs.paid.enqueue("42") for _ in range(3)]
    for job in jobs:
        _wait_status(job.id, "waiting")
    time.sleep(0.5)
    elapsed = _claimed_after(
        jobs[0].id, lambda: emit_event("invoice.paid", key="42", payload={"ok": 1})
    )
    for job in jobs:
        _wait_status(job.id, "completed", timeout=5)
        assert Job.objects.get(id=job.id).result == {"paid": {"ok": 1}}
    assert elapsed < CLAIM_DEADLINE, f"claimed {elapsed:.3f}s after the event's commit"


def test_an_async_jobs_wait_parks_and_the_signal_wakes_it(start_worker: Start) -> None:
    start_worker("--queues", "durable", "--concurrency", "2", env=POLL)
    job = signal_jobs.async_approval.enqueue()
    _wait_status(job.id, "waiting")
    send_signal(job.id, "approval", [1, 2])
    _wait_status(job.id, "completed", timeout=5)
    assert Job.objects.get(id=job.id).result == [1, 2]
