"""Durable jobs under real ``runjobs`` processes: a sleep frees its worker's slot and
the job wakes on time; an atomic step's rows exist once after a SIGKILL inside a run
and after a frozen zombie (SIGSTOP, reclaimed, thawed); an async job steps and sleeps.

Timings come from tests/settings.py (heartbeat 0.5 s, stale after 2 s)."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from django_pgjobs.models import Job, JobStep
from tests import durable_jobs
from tests.conftest import WorkerProcess, wait_until
from tests.process.test_metrics_process import free_port, get, scrape
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


def test_chaos_kills_and_zombies_leave_every_atomic_step_once_and_every_result_stable(
    start_worker: Start, tmp_path: Path
) -> None:
    """Jobs of six steps (two atomic writes, three service calls, a sleep) under workers
    SIGKILLed at random points and now and then frozen (SIGSTOP) past STALE_AFTER and
    thawed: every job completes, each atomic step's row exists exactly once, every
    service step was called at least once, and its stored answer never changed."""
    rng = random.Random(40)
    query("CREATE TABLE chaos_rows (ord int, step text)")
    try:
        orders = range(16)
        ids = [durable_jobs.chaos_order.enqueue(o, str(tmp_path)).id for o in orders]
        env = {"PGJOBS_TEST_CALLS": ""}
        workers = [start_worker("--queues", "durable-chaos", "--concurrency", "3", env=env)]
        deadline = time.monotonic() + 180
        frozen: WorkerProcess | None = None
        thaw_at = 0.0
        kills = freezes = 0
        while time.monotonic() < deadline:
            if Job.objects.filter(id__in=ids, status="completed").count() == len(ids):
                break
            time.sleep(rng.uniform(0.3, 1.0))
            if frozen is not None and time.monotonic() >= thaw_at:
                os.killpg(frozen.pid, signal.SIGCONT)  # a zombie now: reaped meanwhile
                frozen = None
            live = [w for w in workers if w.proc.poll() is None and w is not frozen]
            if kills < 10 and live and rng.random() < 0.7:
                victim = rng.choice(live)
                if frozen is None and rng.random() < 0.25:
                    os.killpg(victim.pid, signal.SIGSTOP)  # past STALE_AFTER (2 s)
                    frozen, thaw_at, freezes = victim, time.monotonic() + 3.5, freezes + 1
                else:
                    victim.signal(signal.SIGKILL)
                    kills += 1
            if sum(w.proc.poll() is None and w is not frozen for w in workers) < 2:
                workers.append(
                    start_worker("--queues", "durable-chaos", "--concurrency", "3", env=env)
                )
        if frozen is not None:
            os.killpg(frozen.pid, signal.SIGCONT)
        done = dict(Job.objects.filter(id__in=ids).values_list("id", "status"))
        assert set(done.values()) == {"completed"}, (done, kills, freezes)
        lost = sum(
            any(str(e.get("type", "")).endswith("WorkerLost") for e in errors)
            for errors in Job.objects.filter(id__in=ids).values_list("errors", flat=True)
        )
        print(f"chaos: {kills} kills, {freezes} freezes, {lost} jobs reclaimed from lost workers")
        assert kills >= 3 and lost >= 3, "the chaos hit too few runs to mean anything"
        rows = query("SELECT ord, step, count(*) FROM chaos_rows GROUP BY ord, step")
        assert sorted(rows) == sorted((o, s, 1) for o in orders for s in ("invoice", "reserve")), (
            "an atomic step's row is missing or doubled"
        )
        called: dict[tuple[str, str], set[str]] = {}
        for line in (tmp_path / "service.log").read_text().splitlines():
            order, what, answer = line.split()
            called.setdefault((order, what), set()).add(answer)
        assert set(called) == {(str(o), w) for o in orders for w in ("charge", "ship", "review")}
        # every run that reached the end saw the same answers: the stored ones
        seen: dict[str, set[tuple[str, ...]]] = {}
        for line in (tmp_path / "seen.log").read_text().splitlines():
            order, *answers = line.split()
            seen.setdefault(order, set()).add(tuple(answers))
        for job_id, order in zip(ids, orders, strict=True):
            [answers] = seen[str(order)]
            assert list(answers) == Job.objects.get(id=job_id).result
            stored = dict(
                JobStep.objects.filter(job_id=job_id, kind="step").values_list("name", "result")
            )
            assert [stored["charge"], stored["ship"], stored["review"]] == list(answers)
    finally:
        query("DROP TABLE IF EXISTS chaos_rows")


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
            get(samples, "pgjobs_worker_inflight") == 0
            and get(samples, "pgjobs_queue_jobs", queue="durable", state="waiting") == 500
            and get(samples, "pgjobs_queue_jobs", queue="durable", state="running") == 0
        )

    wait_until(idle, timeout=20, message="the worker's gauges: no slot taken, 500 waiting")
    samples, _ = scrape(port)
    parked = get(
        samples,
        "pgjobs_jobs_finished_total",
        task=durable_jobs.sleeps.name,
        queue="durable",
        outcome="parked",
    )
    assert parked == 500
    assert Job.objects.filter(status="waiting", attempts=0).count() == 500
