"""Debounce and keep-latest on a real PostgreSQL: one job per pending key, its run_at
moved on by each enqueue and bounded by max_wait, its arguments the latest (or the
first) ones; atomic under concurrent enqueues and inside the caller's transaction;
from ``enqueue``, ``enqueue_many``, ``Job.objects.enqueue`` and ``pgjobs_enqueue()``."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_pgjobs import job
from django_pgjobs.claim.run import claim as run_claim
from django_pgjobs.jobs import registry
from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from tests import flow_jobs

db = pytest.mark.django_db
QUEUE = "flow-debounce"


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        value: datetime = cursor.fetchone()[0]
    return value


def advance(job_id: int, seconds: float) -> None:
    """Move the clock ``seconds`` on for one job: its stored times go back by as much
    (the database's now() cannot be moved; what a debounce compares is the distance
    between now() and the row's times)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_pgjobs_job SET created_at = created_at - make_interval(secs => %s),"
            " run_at = run_at - make_interval(secs => %s),"
            " debounce_until = debounce_until - make_interval(secs => %s) WHERE id = %s",
            [seconds, seconds, seconds, job_id],
        )


def run_due(timeout: float = 10.0) -> list[Any]:
    """Run the debounce queue's jobs once one is due (a short debounce passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ran = run_jobs([QUEUE])
        if ran:
            return ran
        time.sleep(0.05)
    raise AssertionError("no debounced job became due")


# -- options and their errors ---------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"debounce": 5}, TypeError, "needs a debounce_key"),
        ({"debounce_key": "d:{doc_id}"}, TypeError, "debounce_key of @job .* need debounce"),
        ({"max_wait": 60, "keep": "first"}, TypeError, "max_wait, keep of .* need debounce"),
        (
            {"debounce": timedelta(seconds=30), "debounce_key": "d", "max_wait": 10},
            ValueError,
            r"max_wait of .* \(10 s\) must be at least its debounce \(30 s\)",
        ),
        ({"debounce": 5, "debounce_key": "d", "keep": "last"}, ValueError, 'keep of .* "latest"'),
        ({"debounce": -1, "debounce_key": "d"}, ValueError, "debounce of .* from 0 seconds"),
        (
            {"debounce": "5s", "debounce_key": "d"},
            TypeError,
            r"seconds \(int or float\) or a timedelta",
        ),
        ({"debounce": 5, "debounce_key": "d:{0}"}, ValueError, "not positions"),
        ({"debounce": 5, "debounce_key": "d:{nope}"}, ValueError, "'nope', which is not a param"),
        ({"debounce": 5, "debounce_key": 7}, TypeError, "format string over the job's arguments"),
        (
            {"debounce": 5, "debounce_key": "d", "unique_while": "pending"},
            ValueError,
            "debounce and unique_while of .* contradict",
        ),
    ],
)
def test_bad_debounce_options_fail_at_decoration(
    options: dict[str, Any], error: type, fragment: str
) -> None:
    def task(doc_id: int) -> None: ...

    task.__qualname__ = "bad_debounce_task"
    with pytest.raises(error, match=fragment):
        job(**options)(task)
    assert registry.find(f"{__name__}.bad_debounce_task") is None


@db
@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"idempotency_key": "k"}, "idempotency_key cannot be given to .*reindex, a debounced"),
        ({"delay": 3}, "delay cannot be given"),
        ({"run_at": datetime(2030, 1, 1).astimezone()}, "run_at cannot be given"),
    ],
)
def test_options_a_debounced_enqueue_cannot_honour_are_refused(
    options: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        flow_jobs.reindex.using(**options).enqueue(1)
    with pytest.raises(ValueError, match=r"unique_key cannot be given .* is its key"):
        flow_jobs.reindex.using(unique_key="k").enqueue(1)
    assert not Job.objects.exists()


# -- one job per pending key -----------------------------------------------------------


@db
def test_an_enqueue_moves_the_pending_job_on_and_takes_the_latest_arguments() -> None:
    first = flow_jobs.reindex.enqueue(1, version=1)
    assert first.unique_key == "pending:tests.flow_jobs.reindex:reindex:1"
    # the first enqueue's time (the database's now(), as for a delay) + 5 s, + 1 min
    origin = first.debounce_until - timedelta(minutes=1)
    assert first.run_at - origin == timedelta(seconds=5)
    assert abs(first.created_at - origin) < timedelta(seconds=5)
    advance(first.id, 3)
    again = flow_jobs.reindex.enqueue(1, version=2)
    assert again.id == first.id and not hasattr(again, "_pgjobs_inserted")
    assert again.kwargs == {"version": 2} and again.args == [1]
    # now + 5 s: 3 s after the first enqueue on the moved clock (plus the real time
    # between the two statements)
    origin = again.debounce_until - timedelta(minutes=1)
    assert timedelta(seconds=8) <= again.run_at - origin < timedelta(seconds=10)
    stored = Job.objects.get(id=first.id)
    assert (stored.kwargs, stored.run_at, stored.status) == (
        {"version": 2},
        again.run_at,
        "pending",
    )
    other = flow_jobs.reindex.enqueue(2)  # another document: another key
    assert other.id != first.id and Job.objects.count() == 2


@db
def test_keep_first_keeps_the_first_arguments_and_still_moves_the_job_on() -> None:
    first = flow_jobs.reindex_first.enqueue(1, version=1)
    again = flow_jobs.reindex_first.enqueue(1, version=2)
    assert again.id == first.id and again.kwargs == {"version": 1}
    assert again.run_at >= first.run_at
    assert Job.objects.get(id=first.id).kwargs == {"version": 1}


@db
def test_max_wait_bounds_the_delay_under_a_steady_stream_on_a_moving_clock() -> None:
    """An enqueue every second for two minutes of the clock: the job stays 5 s ahead
    until a minute after the first enqueue, and never later; then it is due, runs once
    with the latest arguments, and the stream starts a new job."""
    first = flow_jobs.reindex.enqueue(7, version=0)
    for second in range(1, 121):
        advance(first.id, 1)
        row = flow_jobs.reindex.enqueue(7, version=second)
        assert row.id == first.id
        # from the first enqueue, on the moved clock
        planned = row.run_at - (row.debounce_until - timedelta(minutes=1))
        if second < 50:  # now + 5 s (plus the real time the test has taken so far)
            assert timedelta(seconds=second + 5) <= planned < timedelta(seconds=second + 8)
        elif second >= 55:  # the bound: first enqueue + max_wait, exactly
            assert planned == timedelta(minutes=1), second
        assert planned <= timedelta(minutes=1), second
    assert Job.objects.get(id=first.id).run_at <= db_now()  # due: the bound was reached
    ran = run_jobs([QUEUE])
    assert [(r.id, r.status, r.value) for r in ran] == [
        (first.id, "completed", {"doc_id": 7, "version": 120})
    ]
    assert flow_jobs.reindex.enqueue(7, version=121).id != first.id


@db
def test_an_enqueue_after_the_job_started_makes_a_new_job() -> None:
    first = flow_jobs.reindex.enqueue(3, version=1)
    advance(first.id, 10)  # due
    claimed = run_claim(connection, worker="w", queues=[QUEUE], n=5, tasks=[flow_jobs.reindex.name])
    assert [c.id for c in claimed] == [first.id]
    running = Job.objects.get(id=first.id)
    assert running.status == "running" and running.unique_key is None
    second = flow_jobs.reindex.enqueue(3, version=2)
    assert second.id != first.id and second.status == "pending"
    untouched = Job.objects.get(id=first.id)
    assert (untouched.kwargs, untouched.run_at) == ({"version": 1}, running.run_at)
    assert flow_jobs.reindex.enqueue(3, version=3).id == second.id


@db
def test_enqueue_in_a_rolled_back_transaction_leaves_nothing() -> None:
    kept = flow_jobs.reindex.enqueue(1, version=1)
    with pytest.raises(RuntimeError), transaction.atomic():
        flow_jobs.reindex.enqueue(1, version=2)  # moves the kept job on ...
        flow_jobs.reindex.enqueue(2, version=2)  # ... and makes a new one
        raise RuntimeError("roll back")
    assert list(Job.objects.values_list("id", "kwargs", "run_at")) == [
        (kept.id, {"version": 1}, kept.run_at)
    ]


@db
def test_enqueue_many_and_enqueue_by_name_meet_on_the_same_job() -> None:
    calls = [((1,), {"version": 1}), ((2,), {"version": 1}), ((1,), {"version": 2})]
    assert flow_jobs.reindex.enqueue_many(calls) == 2  # two keys: two new jobs
    by_name = Job.objects.enqueue(flow_jobs.reindex.name, args=[1], kwargs={"version": 3})
    jobs = {j.args[0]: j for j in Job.objects.all()}
    assert set(jobs) == {1, 2} and by_name.id == jobs[1].id
    assert jobs[1].kwargs == {"version": 3} and jobs[2].kwargs == {"version": 1}
    assert flow_jobs.reindex.enqueue_many([((2,), {"version": 9})]) == 0
    assert Job.objects.get(id=jobs[2].id).kwargs == {"version": 9}
    with pytest.raises(TypeError, match=r"enqueue_many item 1: .*too many positional"):
        flow_jobs.reindex.enqueue_many([(8,), (1, 2, 3)])
    assert not Job.objects.filter(args=[8]).exists()  # the call wrote nothing


# -- concurrent enqueues ---------------------------------------------------------------


def _race(enqueue: Any, threads: int = 8, total: int = 1000) -> list[int]:
    """``total`` enqueues from ``threads`` threads, each on its own connection and in
    autocommit, started together; the ids they got back."""
    barrier = threading.Barrier(threads)
    ids: list[int] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            for n in range(index, total, threads):
                ids.append(enqueue(n).id)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    started = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join(120)
    assert errors == [] and len(ids) == total
    return ids


@pytest.mark.django_db(transaction=True)
def test_a_thousand_concurrent_enqueues_make_one_job_that_runs_once_with_the_latest() -> None:
    ids = _race(lambda n: flow_jobs.reindex_soon.enqueue(1, version=n))
    assert len(set(ids)) == 1 and Job.objects.count() == 1
    last = flow_jobs.reindex_soon.enqueue(1, version=-1)  # the latest of all
    assert last.id == ids[0]
    ran = run_due()
    assert [(r.id, r.value) for r in ran] == [(ids[0], {"doc_id": 1, "version": -1})]
    assert run_jobs([QUEUE]) == [] and Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_thousand_concurrent_enqueues_keep_the_first_arguments() -> None:
    first = flow_jobs.reindex_first.enqueue(1, version=-1)
    ids = _race(lambda n: flow_jobs.reindex_first.enqueue(1, version=n))
    assert set(ids) == {first.id} and Job.objects.count() == 1
    ran = run_due()
    assert [(r.id, r.value) for r in ran] == [(first.id, {"doc_id": 1, "version": -1})]
    assert run_jobs([QUEUE]) == [] and Job.objects.count() == 1


# -- from SQL --------------------------------------------------------------------------


def _sql_enqueue(**named: Any) -> int | None:
    casts = {"args": "::jsonb", "kwargs": "::jsonb"}
    args = ", ".join(f"{name} => %s{casts.get(name, '')}" for name in named)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT pgjobs_enqueue(%s, {args})", [flow_jobs.reindex.name, *named.values()]
        )
        value: int | None = cursor.fetchone()[0]
    return value


@db
def test_pgjobs_enqueue_debounces_onto_the_job_python_enqueued() -> None:
    first = flow_jobs.reindex.enqueue(4, version=1)
    same = _sql_enqueue(
        args="[4]",
        kwargs='{"version": 2}',
        debounce=timedelta(seconds=5),
        debounce_key="reindex:4",
        max_wait=timedelta(minutes=1),
    )
    assert same == first.id
    stored = Job.objects.get(id=first.id)
    assert stored.kwargs == {"version": 2} and stored.run_at >= first.run_at
    kept = _sql_enqueue(
        args="[4]",
        kwargs='{"version": 3}',
        debounce=timedelta(seconds=5),
        debounce_key="reindex:4",
        keep="first",
    )
    assert kept == first.id and Job.objects.get(id=first.id).kwargs == {"version": 2}
    new = _sql_enqueue(args="[5]", debounce=timedelta(seconds=5), debounce_key="reindex:5")
    row = Job.objects.get(id=new)
    assert row.unique_key == "pending:tests.flow_jobs.reindex:reindex:5"
    # no max_wait: bounded only by the longest delay (1000 years)
    assert row.run_at - (row.debounce_until - timedelta(days=365_000)) == timedelta(seconds=5)
    assert flow_jobs.reindex.enqueue(5).id == new


@db
@pytest.mark.parametrize(
    ("named", "fragment"),
    [
        ({"debounce_key": "k"}, "need debounce"),
        ({"debounce": timedelta(seconds=5)}, "needs a debounce_key"),
        (
            {
                "debounce": timedelta(seconds=5),
                "debounce_key": "k",
                "max_wait": timedelta(seconds=1),
            },
            "max_wait must be at least debounce",
        ),
        ({"debounce": timedelta(seconds=5), "debounce_key": "k", "keep": "last"}, "keep must be"),
        (
            {"debounce": timedelta(seconds=5), "debounce_key": "k", "idempotency_key": "i"},
            "takes no idempotency_key",
        ),
    ],
)
def test_pgjobs_enqueue_refuses_bad_debounce_arguments(
    named: dict[str, Any], fragment: str
) -> None:
    from django.db import DataError, ProgrammingError

    with pytest.raises((DataError, ProgrammingError), match=fragment), transaction.atomic():
        _sql_enqueue(**named)
    assert not Job.objects.exists()


# -- the admin -----------------------------------------------------------------------


@db
def test_the_job_page_says_a_job_is_debounced_and_its_bound(admin_client: Any) -> None:
    row = flow_jobs.reindex.enqueue(9)
    url = f"/admin/django_pgjobs/job/{row.id}/change/"
    page = admin_client.get(url).content.decode()
    assert "each enqueue of its key moves run_at on by the debounce" in page
    assert "never later than" in page and "(its first enqueue + max_wait)" in page
    unbounded = flow_jobs.reindex_soon.enqueue(9)
    page = admin_client.get(f"/admin/django_pgjobs/job/{unbounded.id}/change/").content.decode()
    assert "no max_wait" in page
    advance(row.id, 10)
    run_claim(connection, worker="w", queues=[QUEUE], n=1, tasks=[flow_jobs.reindex.name])
    page = admin_client.get(url).content.decode()
    assert "it has started, so an enqueue of its key makes a new job" in page
    plain = Job.objects.enqueue("tests.testapp.jobs.noop")
    page = admin_client.get(f"/admin/django_pgjobs/job/{plain.id}/change/").content.decode()
    assert "each enqueue of its key" not in page and "it has started" not in page
