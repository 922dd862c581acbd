"""A crash during a chunk (docs/howto/chunk-handlers.md): every job of it is given
back uncharged, and each then runs alone as a suspect, so the job that crashes is
charged alone (docs/explanation/guarantees.md).

Real ``runjobs`` subprocesses and a real SIGKILL; timings from tests/settings.py
(heartbeat 0.5 s, stale after 2 s, reaper every 0.5 s)."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from django_pgjobs.models import Job
from tests import chunk_jobs
from tests.chunk_jobs import CALLS, calls
from tests.conftest import WorkerProcess, wait_until
from tests.helpers.rows import query

LOST = "django_pgjobs.exceptions.WorkerLost"
CRASHED = "django_pgjobs.exceptions.JobCrashed"


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_sigkill_during_a_chunk_gives_every_job_back_and_charges_the_crasher_alone(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    chunk_jobs.create_calls()
    innocents = [chunk_jobs.crashes.enqueue("ok", pause=0.2) for _ in range(4)]
    # in a chunk, its pause keeps the call running until the worker is killed; alone,
    # it takes its own process down at the end of it
    crasher = chunk_jobs.crashes.enqueue("crash", pause=3)
    ids = sorted([j.id for j in innocents] + [crasher.id])
    first = start_worker("--queues", "chunk-crash", "--concurrency", "2")
    wait_until(lambda: calls("crashes"), timeout=60, message="the chunk's call")
    first.signal(signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    assert calls("crashes") == [ids]  # the five jobs, in one call
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {"running"}

    second = start_worker("--queues", "chunk-crash", "--concurrency", "4")
    wait_until(
        lambda: (
            dict(Job.objects.filter(id__in=ids).values_list("id", "status"))
            == {**{j.id: "completed" for j in innocents}, crasher.id: "dead"}
        ),
        timeout=120,
        interval=0.2,
        message="the innocent jobs to complete and the crasher to be dead-lettered",
    )
    assert second.proc.poll() is None, second.output()  # the crasher took only its child
    for job in innocents:
        row = Job.objects.get(id=job.id)
        # the killed run given back (attempt not counted), then one run of its own
        assert (row.attempts, row.suspect) == (1, False), row.errors
        [lost] = row.errors
        assert lost["type"] == LOST and lost["refunded"] is True
    row = Job.objects.get(id=crasher.id)
    assert row.attempts == 1  # max_attempts=1: the run alone charged, the chunk's not
    assert [e["type"] for e in row.errors] == [LOST, CRASHED], row.errors
    assert "the job killed its process (exit 9)" in row.errors[1]["message"]
    # after the chunk, each job ran alone: a call of one, in a child process
    later = query(f"SELECT job_ids, pid FROM {CALLS} WHERE task = 'crashes' ORDER BY n")[1:]
    assert sorted(i for job_ids, _ in later for i in job_ids) == ids
    assert all(len(job_ids) == 1 and pid != second.pid for job_ids, pid in later), later
