"""Chunk handlers (docs/howto/chunks.md): one call for up to N due jobs of a task,
each job with its own outcome, retries, dead letter and fencing.

In-process workers on the real database; the handlers record each call's job ids
(tests/chunk_jobs.py), so the tests count calls and see which jobs each one got.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

from django_pgjobs import ChunkItem, chain
from django_pgjobs.jobs.chunking import MAX_CHUNK
from django_pgjobs.jobs.definition import make_definition
from django_pgjobs.models import Job, JobResult, Queue
from django_pgjobs.testing import run_jobs
from django_pgjobs.worker.loop import Worker
from tests import chunk_jobs
from tests import workflow_jobs as w
from tests.chunk_jobs import calls
from tests.conftest import run_burst_worker, wait_until
from tests.helpers.inprocess_worker import running_worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def call_table() -> None:
    chunk_jobs.create_calls()


def statuses(ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.filter(id__in=ids).values_list("id", "status"))


# ---------------------------------------------------------------- the drain


def test_ten_thousand_jobs_drain_with_one_call_per_chunk() -> None:
    n, size, concurrency = 10_000, 100, 4
    chunk_jobs.collect.enqueue_many([(i,) for i in range(n)])
    ids = list(Job.objects.filter(task=chunk_jobs.collect.name).values_list("id", flat=True))
    worker = Worker(queues=["chunks"], concurrency=concurrency, burst=True, maintenance=False)
    assert run_burst_worker(worker, timeout=120) == 0
    assert Job.objects.filter(id__in=ids, status="completed").count() == n
    made = calls("collect")
    assert all(1 <= len(c) <= size for c in made), [len(c) for c in made]
    # every job in exactly one call, and the calls full but for the last few: a chunk
    # is cut short only when the backlog ran dry under the threads filling at once
    assert Counter(i for c in made for i in c) == Counter(ids)
    assert n // size <= len(made) <= n // size + concurrency, len(made)
    assert worker.counts["completed"] == n


def test_a_chunk_waits_up_to_chunk_wait_for_jobs_enqueued_meanwhile() -> None:
    first = chunk_jobs.collect.enqueue(0)
    done = threading.Event()

    def enqueue_later() -> None:
        # while the first job's chunk waits (chunk_wait: 0.2 s) for more
        try:
            wait_until(lambda: Job.objects.filter(id=first.id, status="running").exists())
            chunk_jobs.collect.enqueue_many([(i,) for i in range(1, 5)])
            done.set()
        finally:
            connections.close_all()

    helper = threading.Thread(target=enqueue_later, daemon=True)
    helper.start()
    running_worker(
        lambda: (
            done.is_set() and Job.objects.filter(queue="chunks", status="completed").count() == 5
        ),
        queues=["chunks"],
    )
    helper.join(10)
    made = calls("collect")
    assert sorted(i for c in made for i in c) == sorted(
        Job.objects.filter(queue="chunks").values_list("id", flat=True)
    )
    assert len(made) < 5  # jobs enqueued during the wait joined a chunk


def test_a_stopping_worker_stops_filling_and_runs_the_chunk_it_has() -> None:
    job = chunk_jobs.patient.enqueue(1)
    worker = Worker(queues=["chunks-patient"], concurrency=2, maintenance=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    # claimed: its chunk waits (chunk_wait: 30 s) for more jobs of its task
    wait_until(lambda: Job.objects.filter(id=job.id, status="running").exists())
    assert calls("patient") == []
    began = time.monotonic()
    worker.request_stop()
    thread.join(15)
    assert not thread.is_alive()
    assert time.monotonic() - began < 10  # not the 30 s of chunk_wait
    assert calls("patient") == [[job.id]]
    assert Job.objects.get(id=job.id).status == "completed"


# ---------------------------------------------------------------- outcomes


def test_a_failure_returned_for_one_job_retries_that_job_only() -> None:
    values: list[Any] = [1, 2, "bad", 4, 5]
    jobs = [chunk_jobs.doubles.enqueue(v) for v in values]
    ids = [j.id for j in jobs]
    bad = jobs[2]
    running_worker(lambda: set(statuses(ids).values()) == {"completed", "dead"}, queues=["chunks"])
    made = calls("doubles")
    for job, value in zip(jobs, values, strict=True):
        row = Job.objects.get(id=job.id)
        if job is bad:
            continue
        assert (row.status, row.attempts, row.errors) == ("completed", 1, [])
        assert JobResult.objects.get(job_id=job.id).value == value * 2
        assert sum(c.count(job.id) for c in made) == 1  # never called again
    row = Job.objects.get(id=bad.id)
    assert (row.status, row.attempts) == ("dead", 3)
    assert [e["type"] for e in row.errors] == ["builtins.ValueError"] * 3
    assert f"bad item of job {bad.id}" in (row.last_error or "")
    # its retries ran in chunks of their own (its neighbours had completed)
    assert sum(c.count(bad.id) for c in made) == 3
    assert [c for c in made if bad.id in c][1:] == [[bad.id], [bad.id]]


def test_a_raising_handler_charges_each_job_of_its_chunk_once() -> None:
    jobs = [chunk_jobs.raises.enqueue(i) for i in range(3)]
    ids = [j.id for j in jobs]
    running_worker(lambda: set(statuses(ids).values()) == {"dead"}, queues=["chunks"])
    made = calls("raises")
    assert made[0] == sorted(ids)  # claimed together, called together
    for job in jobs:
        row = Job.objects.get(id=job.id)
        in_calls = sum(c.count(job.id) for c in made)
        # one attempt and one error entry per call it was in, no more
        assert row.attempts == in_calls == 2
        assert [e["type"] for e in row.errors] == ["builtins.RuntimeError"] * 2
        assert row.errors[0]["message"] == "the chunk's API call failed"


def test_a_cancelled_job_inside_a_chunk_gets_no_completed_write() -> None:
    jobs = [chunk_jobs.waits_for_cancel.enqueue(i) for i in range(3)]
    ids = [j.id for j in jobs]
    victim = jobs[1]

    def cancel_once_called() -> None:
        try:
            wait_until(lambda: calls("waits_for_cancel"), message="the chunk's call")
            Job.objects.filter(id=victim.id).cancel()
        finally:
            connections.close_all()

    helper = threading.Thread(target=cancel_once_called, daemon=True)
    helper.start()
    worker = running_worker(
        lambda: (
            statuses(ids)
            == {
                jobs[0].id: "completed",
                victim.id: "cancelled",
                jobs[2].id: "completed",
            }
        ),
        queues=["chunks"],
    )
    helper.join(10)
    assert calls("waits_for_cancel") == [sorted(ids)]
    assert Job.objects.get(id=victim.id).status == "cancelled"
    assert not JobResult.objects.filter(job_id=victim.id).exists()
    assert worker.counts["fenced"] == 1 and worker.counts["completed"] == 2


def test_heartbeats_cover_every_job_of_a_chunk_running_past_stale_after() -> None:
    # 3 s of call against STALE_AFTER = 2 s (tests/settings.py), the reaper running:
    # a job of the chunk left unbeaten would be reclaimed from under it
    jobs = [chunk_jobs.sleeps.enqueue(3) for _ in range(4)]
    ids = [j.id for j in jobs]
    worker = Worker(queues=["chunks-slow"], concurrency=2, burst=True, poll_interval=0.1)
    assert run_burst_worker(worker, timeout=60) == 0
    assert calls("sleeps") == [sorted(ids)]
    for job in jobs:
        row = Job.objects.get(id=job.id)
        assert (row.status, row.attempts, row.errors, row.suspect) == ("completed", 1, [], False)
    assert worker.counts["fenced"] == 0


def test_the_jobs_timeout_applies_to_the_chunk_call() -> None:
    jobs = [chunk_jobs.sleeps.using(timeout=0.5).enqueue(3) for _ in range(3)]
    ids = [j.id for j in jobs]
    worker = running_worker(lambda: set(statuses(ids).values()) == {"dead"}, queues=["chunks-slow"])
    assert calls("sleeps") == [sorted(ids)]
    for job in jobs:
        row = Job.objects.get(id=job.id)
        # each job of the call given up on once, charged once (max_attempts=1: dead)
        assert [e["type"] for e in row.errors] == ["django_pgjobs.exceptions.JobTimeout"]
        assert row.attempts == 1
    assert worker.counts["timed_out"] == 3


def test_an_async_chunk_handler_returns_each_jobs_result() -> None:
    jobs = [chunk_jobs.async_sums.enqueue(i, 10) for i in range(7)]
    worker = Worker(queues=["chunks"], concurrency=2, burst=True, maintenance=False)
    assert run_burst_worker(worker) == 0
    for i, job in enumerate(jobs):
        assert Job.objects.get(id=job.id).status == "completed"
        assert JobResult.objects.get(job_id=job.id).value == i + 10


def test_a_limited_queue_gets_no_fill_and_its_limit_holds() -> None:
    Queue.objects.create(name="chunks-limited", max_running=2)
    limited = chunk_jobs.collect.using(queue="chunks-limited")
    jobs = [limited.enqueue(i) for i in range(9)]
    ids = [j.id for j in jobs]
    running_worker(lambda: set(statuses(ids).values()) == {"completed"}, queues=["chunks-limited"])
    made = calls("collect")
    assert sorted(i for c in made for i in c) == sorted(ids)
    assert all(len(c) <= 2 for c in made), made  # never more running than max_running


def test_chunked_workflow_nodes_get_their_parents_results_as_items() -> None:
    # each chunked node's item starts with its parent's result (chain), its own
    # result is what the handler mapped to it
    first = chain(w.constant.si(5), chunk_jobs.doubles.s()).enqueue()
    second = chain(w.constant.si(7), chunk_jobs.doubles.s()).enqueue()
    worker = Worker(queues=["default", "chunks"], concurrency=2, burst=True, maintenance=False)
    assert run_burst_worker(worker) == 0
    results = [JobResult.objects.get(job_id=run.jobs[-1].id).value for run in (first, second)]
    assert results == [10, 14]


def test_run_jobs_calls_a_chunk_handler_with_one_item() -> None:
    job = chunk_jobs.doubles.enqueue(21)
    run_jobs()
    assert JobResult.objects.get(job_id=job.id).value == 42
    assert calls("doubles") == [[job.id]]


# ---------------------------------------------------------------- the decorator


def handler(items: list[ChunkItem]) -> None:
    return None


def takes_nothing() -> None:
    return None


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"chunk": 0}, ValueError, r"chunk=\.\.\.\) of .* whole number from 1 to"),
        ({"chunk": MAX_CHUNK + 1}, ValueError, "whole number from 1 to"),
        ({"chunk": True}, ValueError, "whole number"),
        ({"chunk": "10"}, ValueError, "whole number"),
        ({"chunk_wait": 1}, TypeError, r"chunk_wait=\.\.\.\) of .* needs chunk=N"),
        ({"chunk": 5, "chunk_wait": -1}, ValueError, "zero or more seconds"),
        ({"chunk": 5, "chunk_wait": "1s"}, TypeError, "seconds .* or a timedelta"),
        ({"chunk": 5, "concurrency_key": "k"}, TypeError, "cannot have a concurrency_key"),
        ({"chunk": 5, "atomic": True}, TypeError, "cannot be atomic=True"),
        ({"chunk": 5, "fair_key": "k"}, TypeError, "cannot have a fair_key"),
    ],
)
def test_bad_chunk_options_are_refused_at_decoration(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make_definition(handler, **options)


@pytest.mark.django_db(transaction=False)
def test_a_chunk_handler_must_take_the_list() -> None:
    with pytest.raises(TypeError, match="must take one positional argument, the list"):
        make_definition(takes_nothing, chunk=3)
    definition = make_definition(handler, chunk=3, chunk_wait=timedelta(seconds=2))
    assert (definition.chunk, definition.chunk_wait) == (3, 2.0)


def test_enqueue_takes_one_items_arguments() -> None:
    # the handler takes one list; each enqueue passes one item's arguments, any
    job = chunk_jobs.collect.enqueue(1, "two", three=3)
    assert (job.args, job.kwargs) == ([1, "two"], {"three": 3})
    assert chunk_jobs.collect.enqueue_many([((i,), {"k": i}) for i in range(3)]) == 3
    with pytest.raises(TypeError, match="argument #0"):
        chunk_jobs.collect.enqueue(object())
