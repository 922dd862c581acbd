"""Limits count what really runs (docs/explanation/guarantees.md),
with real ``runjobs`` processes.

A run the queue writes off while its thread goes on (its timeout, a cancel, the
reaper) keeps its ``concurrency_key`` and ``max_running`` slot until the thread
has really ended. Overlaps are read from the runs' own start and end records
(``tests/helpers/run_records.py``), written by the job thread itself, so a run abandoned by
the worker still says when it ended. Each test fails without the held slots: the
limit is exceeded as soon as the first run is written off.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence

import pytest
from django.core.management import call_command

from django_pgjobs.models import Job, Queue
from tests import flow_jobs, flow_keyed_jobs
from tests.conftest import WorkerProcess, wait_until
from tests.helpers import run_records
from tests.helpers.run_records import max_overlap

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Start = Callable[..., WorkerProcess]
KEYED = {"PGJOBS_TEST_KEYED": "1"}


@pytest.fixture(autouse=True)
def records(transactional_db: None) -> None:
    run_records.create()


def two_workers(start_worker: Start) -> list[WorkerProcess]:
    return [start_worker("--concurrency", "4", env=KEYED) for _ in range(2)]


def wait_final(ids: Sequence[int], key: str, timeout: float = 60) -> None:
    """Every job final and every run of ``key`` ended (abandoned threads included)."""
    wait_until(
        lambda: (
            Job.objects.filter(id__in=ids, status__in=("completed", "dead", "cancelled")).count()
            == len(ids)
            and run_records.unfinished(key) == 0
        ),
        timeout=timeout,
        message=f"{len(ids)} jobs final and their runs ended",
    )


def test_a_timed_out_run_keeps_its_key_slot_until_its_thread_ends(start_worker: Start) -> None:
    # Row B: limit 1, timeout 1 s, runs of 2 s, 4 jobs, 2 workers. Without held slots
    # each timeout lets the next job start while the abandoned thread sleeps on.
    sleeper = flow_keyed_jobs.keyed_sleeper.using(timeout=1, max_attempts=1)
    ids = [sleeper.enqueue("t", 2.0).id for _ in range(4)]
    two_workers(start_worker)
    wait_final(ids, "slots:t")
    intervals = run_records.runs("slots:t")
    assert len(intervals) == 4, intervals
    assert max_overlap(intervals) == 1, intervals
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {"dead"}
    assert all("JobTimeout" in (e or "") for e in Job.objects.values_list("last_error", flat=True))


def test_a_timed_out_run_keeps_its_max_running_slot(start_worker: Start) -> None:
    Queue.objects.create(name="slots-capped", max_running=1)
    sleeper = flow_jobs.capped_sleeper.using(timeout=1, max_attempts=1)
    ids = [sleeper.enqueue(2.0).id for _ in range(3)]
    two_workers(start_worker)
    wait_final(ids, "slots-capped")
    intervals = run_records.runs("slots-capped")
    assert len(intervals) == 3, intervals
    assert max_overlap(intervals) == 1, intervals


def test_a_cancelled_run_keeps_its_slot_even_when_retried_at_once(start_worker: Start) -> None:
    first = flow_keyed_jobs.keyed_sleeper.enqueue("c", 3.0).id
    second = flow_keyed_jobs.keyed_sleeper.enqueue("c", 1.0).id
    two_workers(start_worker)
    wait_until(lambda: run_records.runs("slots:c"), message="the first run started")
    assert [j for _, _, j in run_records.runs("slots:c")] == [first]
    call_command("cancel_jobs", "--ids", str(first))
    assert Job.objects.get(id=first).status == "cancelled"
    # Retried at once, claimed again while the cancelled run's thread still sleeps:
    # the slot stays counted, and the new run does not give back the old run's slot.
    call_command("retry_jobs", "--ids", str(first), "--status", "cancelled")
    assert Job.objects.get(id=first).status in ("pending", "running")
    wait_final([first, second], "slots:c")
    intervals = run_records.runs("slots:c")
    assert sorted(j for _, _, j in intervals) == sorted([first, first, second]), intervals
    assert max_overlap(intervals) == 1, intervals


def test_a_reaped_run_keeps_its_slot_while_its_frozen_worker_comes_back(
    start_worker: Start,
) -> None:
    # A worker frozen (SIGSTOP) past STALE_AFTER is reaped; it resumes soon after.
    # Its thread finishes the run it was in: the job's next run must wait for it.
    first = flow_keyed_jobs.keyed_sleeper.enqueue("r", 4.0).id
    workers = two_workers(start_worker)
    wait_until(lambda: run_records.runs("slots:r"), message="the first run started")
    second = flow_keyed_jobs.keyed_sleeper.enqueue("r", 0.5).id
    running = Job.objects.get(id=first)
    holder = next(w for w in workers if f":{w.pid}:" in (running.worker or ""))
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: Job.objects.get(id=first).lease != running.lease,
            timeout=20,
            message="the frozen worker's job reaped",
        )
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    wait_final([first, second], "slots:r")
    intervals = run_records.runs("slots:r")
    ran = [j for _, _, j in intervals]
    assert ran.count(first) >= 2 and second in ran, intervals  # the reaped job ran again
    assert max_overlap(intervals) == 1, intervals
