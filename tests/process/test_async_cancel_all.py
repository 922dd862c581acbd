"""An ``async def`` job that cancels the other tasks of the worker's event loop, with a
real ``runjobs``: its neighbours are given back uncharged and run again, none is left
claimed without running, and the job that cancelled them is charged
(docs/explanation/guarantees.md, "Hostile values and hostile jobs")."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest

from django_pgjobs.models import Job
from tests import flow_keyed_jobs
from tests.conftest import WorkerProcess, wait_until
from tests.testapp import core_jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

CHARGED = "django_pgjobs.exceptions.CancelledOtherJobs"


def _settled(ids: list[int]) -> bool:
    return not Job.objects.filter(id__in=ids).exclude(status__in=("completed", "dead")).exists()


def _run(w: WorkerProcess, ids: list[int]) -> None:
    wait_until(
        lambda: _settled(ids) or w.proc.poll() is not None,
        timeout=60,
        message="every job to end (a stranded one stays running)",
    )
    assert w.proc.poll() is None, w.output()[-3000:]
    stranded = dict(
        Job.objects.filter(id__in=ids)
        .exclude(status__in=("completed", "dead"))
        .values_list("id", "status")
    )
    assert not stranded, (stranded, w.output()[-3000:])


def _uncharged(neighbours: list[Any], w: WorkerProcess) -> None:
    for job in neighbours:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.errors) == ("completed", 1, []), (
            job.id,
            job.status,
            job.attempts,
            job.errors,
            w.output()[-3000:],
        )


def _charged(hostile: Any, neighbours: list[Any], w: WorkerProcess) -> None:
    hostile.refresh_from_db()
    assert hostile.status == "dead" and hostile.attempts == 1, (hostile.status, w.output())
    (error,) = hostile.errors
    assert error["type"] == CHARGED, error
    # It names the jobs it cancelled, and only neighbours.
    named = {int(n) for n in error["message"].split("job(s) ")[1].split(" on ")[0].split(", ")}
    assert named and named <= {j.id for j in neighbours}, error["message"]


def _stop(w: WorkerProcess) -> None:
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0, w.output()[-3000:]


def test_a_job_cancelling_every_task_strands_no_neighbour_and_is_charged(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Seven async jobs claimed in one batch, the fourth cancels every task of the loop:
    the three that had started were dead-lettered with CancelledError, and the three
    not started yet stayed running for good on the live worker (heartbeaten, never
    reaped, holding their slots)."""
    before = [core_jobs.async_sleep.using(max_attempts=3).enqueue(1.0) for _ in range(3)]
    hostile = core_jobs.cancels_every_task.enqueue()
    after = [core_jobs.async_sleep.using(max_attempts=3).enqueue(1.0) for _ in range(3)]
    neighbours = before + after
    # Enqueued before the worker starts, and 8 threads size its first claim: one batch.
    w = start_worker("--no-maintenance", "--concurrency", "8")
    _run(w, [hostile.id, *(j.id for j in neighbours)])
    _uncharged(neighbours, w)
    _charged(hostile, neighbours, w)
    assert "given back, attempt not counted" in w.output()
    _stop(w)


def test_neighbours_waiting_for_a_loop_slot_or_keyed_are_given_back(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """The same from a task the hostile job spawns, which returns as if nothing
    happened: neighbours waiting on the loop's semaphore (--async-concurrency 2),
    a keyed one with a timeout, all run again uncharged; the key's slot comes back."""
    keyed = flow_keyed_jobs.async_keyed_sleep.enqueue("k", 1.0)
    first = core_jobs.async_sleep.using(max_attempts=3).enqueue(1.0)
    hostile = core_jobs.cancels_the_others.enqueue()
    waiting = [core_jobs.async_sleep.using(max_attempts=3).enqueue(0.2) for _ in range(3)]
    same_key = flow_keyed_jobs.async_keyed_sleep.enqueue("k", 0.2)
    neighbours = [keyed, first, *waiting, same_key]
    w = start_worker(
        "--no-maintenance",
        "--concurrency",
        "8",
        "--async-concurrency",
        "3",
        env={"PGJOBS_TEST_KEYED": "1"},  # the worker knows the keyed job
    )
    _run(w, [hostile.id, *(j.id for j in neighbours)])
    _uncharged(neighbours, w)
    _charged(hostile, neighbours, w)
    _stop(w)
