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
    """The prefetch follows the observed job time: for 0.5 s jobs it is 0, so a worker
    that starts first holds its two running jobs, not the queue, when the next starts.

    Measured at the second worker's first claim (``started_at`` is the claim's time,
    ``finished_at`` the outcome write's), not as a split of the whole queue: how many
    jobs the second gets depends on how long its start-up takes on a loaded box."""
    core_jobs.nap.enqueue_many([(0.5,)] * 60)
    first = start_worker("--concurrency", "2", "--no-maintenance", "--burst")
    wait_until(
        lambda: Job.objects.filter(status="completed").exists(),
        timeout=30,
        message="the first worker to finish a job",
    )
    second = start_worker("--concurrency", "2", "--no-maintenance", "--burst")
    assert first.wait(timeout=90) == 0, first.output()[-3000:]
    assert second.wait(timeout=90) == 0, second.output()[-3000:]
    assert Job.objects.filter(status="completed").count() == 60
    first_id = Job.objects.order_by("started_at").values_list("worker", flat=True)[0]
    seconds = Job.objects.exclude(worker=first_id)
    assert seconds.exists(), "the second worker claimed nothing: the queue was gone"
    t2 = min(seconds.values_list("started_at", flat=True))
    held = Job.objects.filter(worker=first_id, started_at__lt=t2, finished_at__gt=t2)
    # Two running plus outcomes not yet written (the claimer pauses at 4 waiting);
    # a hoarding worker would hold all the queue left, dozens of jobs.
    assert held.count() <= 6, (held.count(), seconds.count())
