"""A job that returns with a raw transaction open on its connection (``BEGIN``
without ``COMMIT``): its attempt fails, naming why, and the transaction is rolled
back, whether the project's connections close after each job (``CONN_MAX_AGE = 0``:
its writes were rolled back while the job counted as completed) or persist
(``CONN_MAX_AGE = None``: every later job on that thread wrote into the same
uncommitted transaction, which sat "idle in transaction" holding the xmin horizon)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from django_pgjobs.models import Job
from django_pgjobs.worker import job_connection
from django_pgjobs.worker.loop import Worker
from django_pgjobs.worker.runners import JobRunners
from tests.conftest import run_burst_worker
from tests.helpers.job_connection import idle_in_transaction, numbers_in
from tests.testapp import core_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _assert_none_idle_in_transaction() -> None:
    assert idle_in_transaction() == 0


@pytest.mark.parametrize("max_age", [0, None], ids=["closed-after-each-job", "persistent"])
def test_a_job_that_leaves_a_transaction_open_fails_and_its_neighbours_commit(
    table: str, max_age: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", max_age)
    bad = jobs.leaves_transaction_open.using(priority=10).enqueue(table, 1)
    later = [jobs.writes_n.enqueue(table, n) for n in (2, 3)]  # after it, on its thread
    assert run_burst_worker(Worker(burst=True, maintenance=False, concurrency=1)) == 0
    row = Job.objects.get(id=bad.id)
    assert row.status == "dead", row.errors
    assert row.errors[0]["type"] == "django_pgjobs.exceptions.TransactionLeftOpen"
    assert "a BEGIN without COMMIT" in row.errors[0]["message"]
    assert [Job.objects.get(id=j.id).status for j in later] == ["completed", "completed"]
    assert numbers_in(table) == [2, 3]  # its own write rolled back, the neighbours' committed
    _assert_none_idle_in_transaction()


def test_jobs_that_query_in_autocommit_are_not_taken_for_leaving_one_open(table: str) -> None:
    done = [jobs.writes_n.enqueue(table, n) for n in range(5)]
    assert run_burst_worker(Worker(burst=True, maintenance=False, concurrency=2)) == 0
    assert {Job.objects.get(id=j.id).status for j in done} == {"completed"}
    assert numbers_in(table) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("max_age", [0, None], ids=["closed-after-each-job", "persistent"])
def test_an_async_job_that_leaves_the_shared_orm_connection_in_a_transaction_fails(
    table: str, max_age: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``async def`` jobs' ORM calls share one connection on asgiref's thread: left
    inside a transaction, every later async job wrote into it, reported completed,
    and nothing of theirs was ever committed while the worker lived."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", max_age)
    bad = core_jobs.async_leaves_transaction_open.using(priority=10).enqueue(table, 1)
    later = [core_jobs.async_writes_n.enqueue(table, n) for n in (2, 3)]
    one_at_a_time = Worker(burst=True, maintenance=False, concurrency=1, async_concurrency=1)
    assert run_burst_worker(one_at_a_time) == 0
    row = Job.objects.get(id=bad.id)
    assert row.status == "dead", row.errors
    assert row.errors[0]["type"] == "django_pgjobs.exceptions.TransactionLeftOpen"
    assert "shared ORM connection" in row.errors[0]["message"]
    assert [Job.objects.get(id=j.id).status for j in later] == ["completed", "completed"]
    assert numbers_in(table) == [2, 3]
    _assert_none_idle_in_transaction()


def test_no_async_job_beside_one_that_leaves_a_transaction_open_counts_as_completed_unwritten(
    table: str,
) -> None:
    """Running beside it on the loop, other async jobs may write into that transaction
    before anything can notice; whichever job ends first, none whose write was rolled
    back is reported completed (they fail with TransactionLeftOpen and are retried)."""
    bad = core_jobs.async_leaves_transaction_open.enqueue(table, 0)
    beside = [core_jobs.async_writes_n.enqueue(table, n) for n in range(1, 9)]
    assert run_burst_worker(Worker(burst=True, maintenance=False, concurrency=1)) == 0
    assert Job.objects.get(id=bad.id).status == "dead"
    written = set(numbers_in(table))
    for ran in beside:
        row = Job.objects.get(id=ran.id)
        if row.status == "completed":
            assert row.args[1] in written, f"job {row.id} completed, its write rolled back"
        else:
            assert row.status == "dead", row.status
            assert row.errors[0]["type"] == "django_pgjobs.exceptions.TransactionLeftOpen"
    _assert_none_idle_in_transaction()


def test_async_jobs_that_query_in_autocommit_are_not_taken_for_leaving_one_open(
    table: str,
) -> None:
    done = [core_jobs.async_writes_n.enqueue(table, n) for n in range(6)]
    assert run_burst_worker(Worker(burst=True, maintenance=False, concurrency=3)) == 0
    assert {Job.objects.get(id=j.id).status for j in done} == {"completed"}
    assert numbers_in(table) == [0, 1, 2, 3, 4, 5]


def test_an_async_job_returning_while_another_ones_query_runs_is_not_taken_for_one(
    table: str,
) -> None:
    """The shared connection is busy (ACTIVE) with a neighbour's query when these
    return: none is taken for one that left a transaction open, and those that sent
    no query are not held until that query ends."""
    slow = core_jobs.async_sleeps_in_the_database.using(priority=10).enqueue(2.0)
    quick = [core_jobs.async_writes_n.enqueue(table, n) for n in range(4)]
    no_orm = [core_jobs.async_sleep.enqueue(0.2) for _ in range(3)]  # end mid-query
    assert run_burst_worker(Worker(burst=True, maintenance=False, concurrency=1)) == 0
    assert Job.objects.get(id=slow.id).status == "completed"
    assert {Job.objects.get(id=j.id).status for j in quick + no_orm} == {"completed"}
    slow_end = Job.objects.get(id=slow.id).finished_at
    for ran in Job.objects.filter(id__in=[j.id for j in no_orm]):
        assert (slow_end - ran.finished_at).total_seconds() > 1.0, "held behind the query"
    assert numbers_in(table) == [0, 1, 2, 3]


def test_a_job_thread_looks_its_connection_up_once_and_other_threads_every_time() -> None:
    """The job threads' wrapper cache (``serve_jobs``): on a job thread the cached
    wrapper is that thread's own ``connections[alias]``, the same object every job; a
    thread not marked (here the test's) looks it up each time, so a rig that deletes
    the main thread's wrapper gets the new one."""
    seen: list[tuple[object, object, object]] = []
    done = threading.Event()

    def look(_: int) -> None:
        seen.append(
            (
                job_connection._wrapper("default"),
                job_connection._wrapper("default"),
                connections["default"],
            )
        )
        if len(seen) == 2:
            done.set()

    runners: JobRunners[int] = JobRunners(1, look, "test-job", job_connection.serve_jobs)
    try:
        runners.submit(1)
        runners.submit(2)
        assert done.wait(10)
    finally:
        runners.shutdown()
    (first, again, own), (later, _, _) = seen
    assert first is again is own is later  # the job thread's own wrapper, looked up once
    assert first is not connections["default"]  # not the test thread's
    assert job_connection._thread.wrappers is None  # this thread was not marked
    assert job_connection._wrapper("default") is connections["default"]
    assert not job_connection.left_open("default")
