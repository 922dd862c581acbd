"""Real ``runjobs`` subprocesses, real signals: crashes, zombies, shutdown, wake-ups.

Timings come from tests/settings.py (heartbeat 0.5 s, stale after 2 s, reaper
every 0.5 s), so a crashed worker's job is reclaimed within about 3 s.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_pgjobs.models import Job, JobResult
from django_pgjobs.models import Worker as WorkerRow
from tests.conftest import WorkerProcess, wait_until
from tests.helpers.rows import query, snapshot
from tests.testapp import core_jobs, jobs

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Start = Callable[..., WorkerProcess]


@pytest.fixture
def runs() -> Iterator[str]:
    """A table every ``record_run`` execution appends to (no unique key: dupes show)."""
    query("CREATE TABLE wk_runs (seq bigserial, job_id bigint, lease bigint, pid int)")
    yield "wk_runs"
    query("DROP TABLE IF EXISTS wk_runs")


def job_row(job: Job) -> Job:
    return Job.objects.get(id=job.id)


def wait_running_on(job: Job, worker: WorkerProcess, timeout: float = 20) -> Job:
    """Until ``job`` is running on the worker process ``worker``."""

    def check() -> Any:
        row = job_row(job)
        return row.status == "running" and row.worker and f":{worker.pid}:" in row.worker

    wait_until(check, timeout=timeout, message=f"job {job.id} running on pid {worker.pid}")
    return job_row(job)


def wait_status(job: Job, status: str, timeout: float = 20) -> Job:
    wait_until(
        lambda: job_row(job).status == status,
        timeout=timeout,
        message=f"job {job.id} to be {status}",
    )
    return job_row(job)


def listening(worker: WorkerProcess) -> bool:
    """The worker registered its row and its LISTEN connection is up."""
    return WorkerRow.objects.filter(pid=worker.pid).exists() and bool(
        query(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN pgjobs'"
        )
    )


# -- crashes --------------------------------------------------------------------------


def test_sigkill_mid_job_is_completed_by_another_worker(start_worker: Start, runs: str) -> None:
    job = jobs.record_run.enqueue(runs, 1.0)
    a = start_worker("--concurrency", "1")
    wait_running_on(job, a)
    a.signal(signal.SIGKILL)
    a.wait()
    b = start_worker("--concurrency", "1")
    done = wait_status(job, "completed", timeout=20)
    # claim, reap, claim again; the lost worker's attempt was given back
    assert done.attempts == 1 and done.lease == 3
    assert f":{b.pid}:" in (done.worker or "")
    assert [e["type"] for e in done.errors] == ["django_pgjobs.exceptions.WorkerLost"]
    assert query(f"SELECT job_id, lease FROM {runs}") == [(job.id, 3)]


def test_sigstop_zombie_is_fenced_and_atomic_writes_roll_back(
    start_worker: Start, runs: str
) -> None:
    query("CREATE TABLE wk_atomic (job_id bigint, lease bigint)")
    a = None
    try:
        plain = jobs.record_run.using(queue="zombie").enqueue(runs, 1.0)
        atomic = jobs.atomic_insert.using(queue="zombie").enqueue("wk_atomic", 1.0)
        a = start_worker("--queues", "zombie", "--concurrency", "2")
        wait_running_on(plain, a)
        wait_running_on(atomic, a)
        a.signal(signal.SIGSTOP)  # a long GC pause, a frozen VM: alive but silent
        b = start_worker("--queues", "zombie", "--concurrency", "2")
        # b's start-up, STALE_AFTER, a reaper pass and the isolated reruns (child
        # processes) first, with room for a loaded box
        plain_done = wait_status(plain, "completed", timeout=90)
        atomic_done = wait_status(atomic, "completed", timeout=90)
        wait_until(lambda: len(query(f"SELECT 1 FROM {runs}")) == 1, message="b's run")
        before = {j.id: snapshot(j.id) for j in (plain, atomic)}
        assert all(f":{b.pid}:" in s["worker"] and s["lease"] == 3 for s in before.values())

        a.signal(signal.SIGCONT)
        wait_until(
            lambda: a.output().count("the complete write changed nothing") == 2,
            timeout=15,
            message="both zombie completions to be refused",
        )
        # The zombie's writes changed nothing...
        assert {j.id: snapshot(j.id) for j in (plain, atomic)} == before
        assert JobResult.objects.get(job_id=atomic.id).value == 3
        assert plain_done.attempts == atomic_done.attempts == 1  # the reclaim refunded it
        # ...except what a non-atomic handler did itself (at-least-once: it ran twice),
        ran = sorted(query(f"SELECT lease FROM {runs} WHERE job_id = %s", [plain.id]))
        assert ran == [(1,), (3,)]
        # while the atomic handler's insert rolled back with its refused completion.
        assert query("SELECT job_id, lease FROM wk_atomic") == [(atomic.id, 3)]
    finally:
        if a is not None:
            # A frozen worker's atomic run holds its insert's lock on wk_atomic: the DROP
            # would wait for it until the test's timeout (and break the connection that
            # every later test of this process uses).
            a.stop()
        query("DROP TABLE IF EXISTS wk_atomic")


# -- shutdown -------------------------------------------------------------------------


def test_sigterm_finishes_short_jobs_releases_long_ones_and_exits_0(
    start_worker: Start, runs: str, tmp_path: Path
) -> None:
    short = jobs.record_run.enqueue(runs, 0.5, started=str(tmp_path / "short"))
    long = jobs.record_run.enqueue(runs, 30.0, started=str(tmp_path / "long"))
    w = start_worker("--concurrency", "2", env={"PGJOBS_TEST_SHUTDOWN_TIMEOUT": "1.5"})
    wait_running_on(short, w)
    wait_running_on(long, w)
    # started, not only claimed: a claimed job still waiting for its thread is given
    # back at the signal, not finished
    wait_until(lambda: (tmp_path / "short").exists(), message="the short job to start")
    wait_until(lambda: (tmp_path / "long").exists(), message="the long job to start")
    assert WorkerRow.objects.filter(pid=w.pid).exists()
    w.signal(signal.SIGTERM)
    began = time.monotonic()
    late = jobs.noop.enqueue()  # enqueued after the signal: must not be claimed
    assert w.wait(timeout=15) == 0, w.output()
    assert time.monotonic() - began < 8
    assert job_row(short).status == "completed"
    released = job_row(long)
    assert (released.status, released.attempts, released.lease) == ("pending", 0, 1)
    assert released.errors == [] and released.finished_at is None
    assert job_row(late).status == "pending"
    assert not WorkerRow.objects.filter(pid=w.pid).exists()
    assert "released job" in w.output()


def test_sigterm_gives_back_the_jobs_claimed_ahead_in_one_statement(
    start_worker: Start, runs: str, tmp_path: Path
) -> None:
    """A worker stopped during a drain of fast jobs holds up to --batch of them claimed
    and not started: all go back to pending, uncounted, with one log line (they were
    released one statement and one line each, up to 1,000 with the default batch)."""
    jobs.noop.using(priority=10).enqueue_many([()] * 5)  # the job time is observed
    long = jobs.record_run.using(priority=5).enqueue(runs, 30.0, started=str(tmp_path / "long"))
    jobs.noop.enqueue_many([()] * 50)
    ahead = list(Job.objects.filter(id__gt=long.id).values_list("id", flat=True))
    assert len(ahead) == 50
    w = start_worker("--concurrency", "1", env={"PGJOBS_TEST_SHUTDOWN_TIMEOUT": "0.5"})
    wait_until(lambda: (tmp_path / "long").exists(), message="the long job to start")
    # one thread, busy with the long job: the fast ones claimed after it wait for it
    wait_until(
        lambda: Job.objects.filter(id__in=ahead, status="running").count() == 50,
        message="the 50 fast jobs claimed ahead of the thread",
    )
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=15) == 0, w.output()
    rows = Job.objects.filter(id__in=ahead)
    assert sorted(set(rows.values_list("status", "attempts", "lease"))) == [("pending", 0, 1)]
    assert job_row(long).status == "pending" and job_row(long).attempts == 0
    out = w.output()
    assert out.count("released jobs not started at shutdown (claimed ahead): 50,") == 1, out
    assert f"released job {long.id} " in out  # the running one, after the shutdown timeout


def test_second_signal_exits_at_once(start_worker: Start, runs: str, tmp_path: Path) -> None:
    long = jobs.record_run.enqueue(runs, 30.0, started=str(tmp_path / "started"))
    # STALE_AFTER 30 s: at CI's load the worker's own heartbeat once lagged past the
    # suite's 2 s and its reaper took the job back before the second signal.
    w = start_worker(
        "--concurrency",
        "1",
        env={"PGJOBS_TEST_SHUTDOWN_TIMEOUT": "60", "PGJOBS_TEST_STALE_AFTER": "30"},
    )
    wait_running_on(long, w)
    # started, not only claimed: a job still waiting for its thread is given back at
    # the first signal (CI once saw it pending)
    wait_until(lambda: (tmp_path / "started").exists(), message="the job to start")
    w.signal(signal.SIGTERM)
    wait_until(
        lambda: "send it again to exit at once" in w.output(),
        timeout=5,
        message="the first signal to be handled",
    )
    began = time.monotonic()
    w.signal(signal.SIGINT)
    w.wait(timeout=5)
    assert time.monotonic() - began < 2
    assert job_row(long).status == "running"  # left for the reaper, as logged
    assert "second signal" in w.output()


# -- throughput and exactly-once draining ----------------------------------------------


def test_several_workers_drain_thousands_each_exactly_once(
    start_worker: Start, tmp_path: Path
) -> None:
    marker = tmp_path / "runs.txt"
    marker.touch()
    workers = [start_worker("--concurrency", "4", "--batch", batch) for batch in ("5", "20", "50")]
    wait_until(lambda: WorkerRow.objects.count() == 3, message="3 worker rows")
    total = 3000
    jobs.sleep_then_mark.enqueue_many([(0, str(marker))] * total)
    wait_until(
        lambda: Job.objects.filter(status="completed").count() == total,
        timeout=60,
        interval=0.2,
        message="all jobs completed",
    )
    for w in workers:
        w.signal(signal.SIGTERM)
    assert [w.wait(timeout=15) for w in workers] == [0, 0, 0]
    lines = marker.read_text().split()
    assert len(lines) == total, "a job ran twice (or a completed job never ran)"
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert len(set(lines)) >= 2, "the workers did not share the work"
    assert not WorkerRow.objects.exists()


def test_burst_exits_when_nothing_is_due(start_worker: Start) -> None:
    now = [jobs.noop.enqueue() for _ in range(5)]
    later = jobs.noop.using(delay=600).enqueue()
    w = start_worker("--burst")
    assert w.wait(timeout=20) == 0, w.output()
    assert {job_row(j).status for j in now} == {"completed"}
    assert job_row(later).status == "pending"


def test_max_jobs(start_worker: Start) -> None:
    for _ in range(10):
        jobs.noop.enqueue()
    w = start_worker("--max-jobs", "4", "--concurrency", "2")
    assert w.wait(timeout=20) == 0, w.output()
    assert Job.objects.filter(status="completed").count() == 4
    assert Job.objects.filter(status="pending", attempts=0).count() == 6


def test_queues_option_filters(start_worker: Start) -> None:
    email = jobs.send_email.enqueue("a@b.c")
    other = jobs.noop.using(queue="other").enqueue()
    default = jobs.noop.enqueue()
    w = start_worker("--queues", "emails,other", "--burst")
    assert w.wait(timeout=20) == 0, w.output()
    assert [job_row(j).status for j in (email, other, default)] == [
        "completed",
        "completed",
        "pending",
    ]


def test_priority_order(start_worker: Start, runs: str) -> None:
    made = {
        j.id: j
        for j in (jobs.record_run.using(priority=p).enqueue(runs) for p in (0, -50, 100, 7, 7))
    }
    w = start_worker("--burst", "--concurrency", "1", "--batch", "1")
    assert w.wait(timeout=20) == 0, w.output()
    order = [r[0] for r in query(f"SELECT job_id FROM {runs} ORDER BY seq")]
    assert len(order) == len(made) == 5
    assert [job_row(made[i]).priority for i in order] == [100, 7, 7, 0, -50]


# -- waking up -------------------------------------------------------------------------


def test_future_run_at_is_noticed_by_the_poll(start_worker: Start) -> None:
    w = start_worker("--poll-interval", "0.3", "--no-listen")
    wait_until(lambda: WorkerRow.objects.filter(pid=w.pid).exists(), message="worker row")
    job = jobs.noop.using(delay=1.5).enqueue()
    done = wait_status(job, "completed", timeout=10)
    assert done.started_at is not None and done.started_at >= done.run_at
    assert (done.started_at - done.run_at).total_seconds() < 1.5


def test_listen_wakes_an_idle_worker_within_a_second(start_worker: Start) -> None:
    w = start_worker("--poll-interval", "10")
    wait_until(lambda: listening(w), message="the worker to listen")
    time.sleep(0.2)  # let the loop settle into its 10 s idle wait (not an assertion)
    for _ in range(3):
        job = jobs.noop.enqueue()
        done = wait_status(job, "completed", timeout=3)
        latency = (done.finished_at - done.created_at).total_seconds()  # type: ignore[operator]
        assert latency < 1.0, f"picked up after {latency:.2f}s"


def test_survives_its_connections_being_killed(start_worker: Start) -> None:
    w = start_worker("--poll-interval", "0.3")
    wait_until(lambda: listening(w), message="the worker to listen")
    killed = query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    assert killed
    job = jobs.add.enqueue(1, 2)
    assert wait_status(job, "completed", timeout=15).result == 3
    wait_until(lambda: listening(w), message="LISTEN to be re-established")
    assert w.proc.poll() is None


def test_async_jobs_query_again_after_their_connection_was_killed(start_worker: Start) -> None:
    """``async def`` jobs' ORM calls share one connection that outlives each job; once
    the server dropped it (a restart, a failover; here pg_terminate_backend), every
    later async query failed with "the connection is closed" until the worker
    restarted. A failed run now drops it: one failed attempt, then queries work."""
    w = start_worker("--poll-interval", "0.3")
    for before in (
        core_jobs.async_orm_count_retried.enqueue(),  # the ORM's shared connection opens
        # a keyed one's stored result is looked up first, on another thread: one more
        core_jobs.async_orm_count_retried.using(idempotency_key="before-kill").enqueue(),
    ):
        wait_status(before, "completed", timeout=15)
    assert query(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ) != [(0,)]
    for i in range(6):  # one at a time: each runs on whatever the last one left
        task = core_jobs.async_orm_count_retried
        job = (task.using(idempotency_key=f"after-kill-{i}") if i % 2 else task).enqueue()
        assert wait_status(job, "completed", timeout=20).attempts <= 2, job_row(job).errors
    assert w.proc.poll() is None
