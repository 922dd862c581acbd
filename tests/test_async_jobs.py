"""``async def`` jobs on the worker's event loop, with a real runjobs process:
many at once (more than threads), the async ORM inside, cancellation at shutdown."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_pgjobs.models import Job, JobResult
from tests.conftest import WorkerProcess, wait_until
from tests.testapp import core_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _peak() -> int:
    """Most async_sleep runs in progress at one instant, from the times they record."""
    spans = [r.value for r in JobResult.objects.all() if isinstance(r.value, list)]
    events = sorted(
        [(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda ev: (ev[0], ev[1])
    )
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_async_jobs_run_hundreds_at_once_on_one_loop(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    n, seconds = 300, 0.5
    core_jobs.async_sleep.enqueue_many([(seconds,)] * n)
    begin = time.monotonic()
    w = start_worker("--burst", "--no-maintenance", "--concurrency", "2")
    assert w.wait(timeout=60) == 0, w.output()[-3000:]
    elapsed = time.monotonic() - begin
    assert Job.objects.filter(status="completed").count() == n
    # 2 threads could do 4 jobs per second; 100 async slots do 300 in ~1.5 s.
    assert elapsed < 20, elapsed
    peak = _peak()
    assert 20 < peak <= 100, peak  # far more than the 2 threads; never above the limit


def test_async_concurrency_option_limits_the_loop(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    core_jobs.async_sleep.enqueue_many([(0.3,)] * 30)
    w = start_worker("--burst", "--no-maintenance", "--async-concurrency", "5")
    assert w.wait(timeout=60) == 0, w.output()[-3000:]
    peak = _peak()
    assert Job.objects.filter(status="completed").count() == 30
    assert peak <= 5, peak


def test_the_async_orm_works_inside_an_async_job(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    jobs.noop.enqueue()
    job = core_jobs.async_orm_count.enqueue()
    w = start_worker("--burst", "--no-maintenance")
    assert w.wait(timeout=60) == 0, w.output()[-3000:]
    job.refresh_from_db()
    assert job.status == "completed"
    assert JobResult.objects.get(job_id=job.id).value == 2


def test_async_jobs_are_cancelled_and_released_at_shutdown(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    job = core_jobs.async_sleep.enqueue(60)
    w = start_worker("--no-maintenance", env={"PGJOBS_TEST_SHUTDOWN_TIMEOUT": "1"})

    def running() -> Any:
        job.refresh_from_db()
        return job.status == "running"

    wait_until(running, timeout=20, message="the async job to start")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0, w.output()[-3000:]
    job.refresh_from_db()
    assert job.status == "pending" and job.attempts == 0
    assert "released job" in w.output()


def test_slow_jobs_are_not_hoarded_by_the_first_worker(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """The prefetch follows the observed job time: for 0.4 s jobs it is ~0, so a worker
    that starts first does not claim the queue ahead of the one that starts next."""
    core_jobs.nap.enqueue_many([(0.5,)] * 40)
    first = start_worker("--concurrency", "2", "--no-maintenance", "--burst")
    wait_until(
        lambda: Job.objects.filter(status="completed").exists(),
        timeout=30,
        message="the first worker to finish a job",
    )
    second = start_worker("--concurrency", "2", "--no-maintenance", "--burst")
    assert first.wait(timeout=60) == 0 and second.wait(timeout=60) == 0
    per_worker: dict[str, int] = {}
    for worker_id in Job.objects.values_list("worker", flat=True):
        per_worker[worker_id] = per_worker.get(worker_id, 0) + 1
    assert Job.objects.filter(status="completed").count() == 40
    # Alone, the first worker would take 10 s; the second arrives within ~3 s.
    assert len(per_worker) == 2 and min(per_worker.values()) >= 10, per_worker
