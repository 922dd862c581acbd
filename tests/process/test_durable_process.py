"""Durable jobs under real ``runjobs`` processes: a sleep frees its worker's slot and
the job wakes on time; an atomic step's rows exist once after a SIGKILL inside a run
and after a frozen zombie (SIGSTOP, reclaimed, thawed); an async job steps and sleeps.

Timings come from tests/settings.py (heartbeat 0.5 s, stale after 2 s)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from django_pgjobs.models import Job, JobStep
from tests import durable_jobs
from tests.conftest import WorkerProcess, wait_until
from tests.helpers.metrics_http import free_port, sample_value, scrape
from tests.testapp import jobs

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Start = Callable[..., WorkerProcess]


def query(statement: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def wait_status(job_id: int, status: str, timeout: float = 30) -> Job:
    wait_until(
        lambda: Job.objects.get(id=job_id).status == status,
        timeout=timeout,
        message=f"job {job_id} to be {status}",
    )
    return Job.objects.get(id=job_id)


def steps(job_id: int) -> list[tuple[str, str]]:
    return list(JobStep.objects.filter(job_id=job_id).order_by("seq").values_list("name", "kind"))


def test_a_sleeping_job_frees_its_slot_and_wakes_at_its_time(
    start_worker: Start, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    sleeper = durable_jobs.sleeps.using(queue="default").enqueue(2.0)
    w = start_worker("--concurrency", "1", env={"PGJOBS_TEST_CALLS": str(calls)})
    parked = wait_status(sleeper.id, "waiting")
    assert parked.waiting_for == {"kind": "sleep", "name": "wait"}
    assert parked.attempts == 0
    # The worker's only slot is free while the sleeper waits: another job runs now.
    other = jobs.add.enqueue(1, 2)
    assert wait_status(other.id, "completed", timeout=10).finished_at is not None
    assert Job.objects.get(id=sleeper.id).status == "waiting"
    done = wait_status(sleeper.id, "completed", timeout=20)
    slept = done.result
    assert slept >= 2.0 - 0.05  # woken at its time, not before
    assert slept < 2.0 + 5.0  # by the wake pass (every second), on a loaded box too
    assert done.attempts == 1  # the park did not count its run
    assert steps(sleeper.id) == [("start", "step"), ("wait", "sleep")]
    assert "Traceback" not in w.output()


def test_atomic_step_rows_exist_once_after_a_sigkill_inside_a_run(
    start_worker: Start, tmp_path: Path
) -> None:
    job = durable_jobs.crashing_grants.enqueue("kill", str(tmp_path))
    a = start_worker("--queues", "durable-proc", "--concurrency", "1")
    wait_until(lambda: (tmp_path / "killed").exists(), message="the first run's SIGKILL")
    assert a.wait(timeout=20) == -signal.SIGKILL
    start_worker("--queues", "durable-proc", "--concurrency", "1")
    done = wait_status(job.id, "completed", timeout=60)
    # grant-1 committed before the kill and was skipped; grant-2's row died with its
    # transaction and was written once by the next run.
    names = sorted(Group.objects.filter(name__startswith="kill-").values_list("name", flat=True))
    assert names == ["kill-1", "kill-2"]
    assert done.result == [
        Group.objects.get(name="kill-1").id,
        Group.objects.get(name="kill-2").id,
    ]
    assert steps(job.id) == [("grant-1", "atomic"), ("grant-2", "atomic")]


def test_a_frozen_zombie_atomic_step_is_fenced_and_its_rows_roll_back(
    start_worker: Start, tmp_path: Path
) -> None:
    job = durable_jobs.frozen_grant.enqueue("zombie", str(tmp_path))
    a = start_worker("--queues", "durable-proc", "--concurrency", "1")
    try:
        wait_until(lambda: (tmp_path / "frozen").exists(), message="the first run to freeze")
        b = start_worker("--queues", "durable-proc", "--concurrency", "1")
        done = wait_status(job.id, "completed", timeout=90)
        assert done.lease == 3 and f":{b.pid}:" in (done.worker or "")
        before = list(Group.objects.filter(name__startswith="zombie-").values_list("name"))
        assert before == [("zombie-lease-3",)]
        os.killpg(a.pid, signal.SIGCONT)
        wait_until(
            lambda: "lease 1 lost" in a.output(),
            timeout=20,
            message="the zombie's fenced step to be reported",
        )
        # The zombie's block and its record rolled back: its row never committed.
        names = list(Group.objects.filter(name__startswith="zombie-").values_list("name"))
        assert names == [("zombie-lease-3",)]
        assert steps(job.id) == [("grant", "atomic")]
        assert Job.objects.get(id=job.id).lease == 3
    finally:
        a.stop()


def test_an_async_job_steps_sleeps_and_completes(start_worker: Start, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    job = durable_jobs.async_sleeps.enqueue(0.5)
    start_worker("--concurrency", "2", env={"PGJOBS_TEST_CALLS": str(calls)})
    done = wait_status(job.id, "completed", timeout=30)
    assert done.result == [1, 2]
    assert calls.read_text().split() == ["async-a", "async-b"]
    assert steps(job.id) == [("a", "step"), ("wait", "sleep"), ("b", "step")]


def test_an_atomic_step_refuses_a_write_to_another_alias(start_worker: Start) -> None:
    job = durable_jobs.writes_elsewhere.enqueue("elsewhere")
    start_worker(
        "--queues",
        "durable-proc",
        "--concurrency",
        "1",
        env={"DJANGO_SETTINGS_MODULE": "tests.settings_two_aliases"},
    )
    dead = wait_status(job.id, "dead")
    assert dead.errors[-1]["type"] == "django_pgjobs.durable.atomic.OtherDatabaseWrite"
    assert "'other'" in dead.errors[-1]["message"] and "'grant'" in dead.errors[-1]["message"]
    # the block's write to the jobs' database rolled back with it: nothing half-done
    assert not Group.objects.filter(name__startswith="elsewhere-").exists()
    assert steps(job.id) == []


def test_a_worker_with_every_job_asleep_reports_every_slot_free(start_worker: Start) -> None:
    """500 sleeping jobs on a worker of 4 slots: all of them parked, none in flight (the
    worker's own gauge), and the queue's gauge counts them as waiting, not running."""
    port = free_port()
    durable_jobs.sleeps.enqueue_many([(3600,)] * 500)
    start_worker(
        "--metrics-port",
        str(port),
        "--concurrency",
        "4",
        env={"PGJOBS_METRICS_INTERVAL": "0.2"},
    )
    wait_until(
        lambda: Job.objects.filter(status="waiting").count() == 500,
        timeout=120,
        message="every sleeper parked",
    )

    def idle() -> bool:
        samples, _ = scrape(port)
        return (
            sample_value(samples, "pgjobs_worker_inflight") == 0
            and sample_value(samples, "pgjobs_queue_jobs", queue="durable", state="waiting") == 500
            and sample_value(samples, "pgjobs_queue_jobs", queue="durable", state="running") == 0
        )

    wait_until(idle, timeout=20, message="the worker's gauges: no slot taken, 500 waiting")
    samples, _ = scrape(port)
    parked = sample_value(
        samples,
        "pgjobs_jobs_finished_total",
        task=durable_jobs.sleeps.name,
        queue="durable",
        outcome="parked",
    )
    assert parked == 500
    assert Job.objects.filter(status="waiting", attempts=0).count() == 500
