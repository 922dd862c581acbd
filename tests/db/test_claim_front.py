"""The claim front (``claim/front.py``): a worker's claims start past the claim-index
entries of the jobs it already claimed, and never past a job that is pending and due."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_pgjobs import claim
from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.claim.front import SLACK, UNPROBED_AFTER, ClaimFront
from django_pgjobs.claim.plain import pending_queues
from django_pgjobs.claim.probe import FRONT_PROBE_ALL, FRONT_PROBE_QUEUES, front_probe
from django_pgjobs.db.notify import parse_payload
from django_pgjobs.db.tables import JOB
from django_pgjobs.models import Job
from django_pgjobs.worker import Worker
from tests.conftest import wait_until
from tests.helpers.claim_front import at, job_status, running_in_thread, unannounced
from tests.helpers.plans import HISTORY, explain_json, fill_jobs
from tests.testapp import jobs

# -- the rules ---------------------------------------------------------------------------


# -- what it saves -------------------------------------------------------------------------


def _returned() -> int:
    """Claim-index entries handed to the executor so far in this transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_tuples_returned('pgjobs_job_claim_idx'::regclass)")
        return int(cursor.fetchone()[0])


def _pending(count: int, age: float, queue: str = "front") -> None:
    """``count`` pending jobs due ``age`` seconds ago, one millisecond apart."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {JOB} (task, queue, priority, args, kwargs, max_attempts, run_at)"
            " SELECT 'tests.testapp.jobs.noop', %s, 0, '[]', '{}', 3,"
            "        now() - make_interval(secs => %s) + g * interval '1 millisecond'"
            "   FROM generate_series(1, %s) AS g",
            [queue, age, count],
        )


@pytest.mark.django_db
def test_a_bounded_claim_does_not_read_the_rows_of_jobs_claimed_before() -> None:
    """The entries of claimed jobs stay in the claim index until VACUUM (here: claimed
    in this transaction, so nothing can remove them, as under a held horizon). A claim
    from the start hands each one to the executor, which reads its row; a claim bounded
    past them checks them on the index entry and hands over only the live ones."""
    _pending(2000, age=3600)
    while claim.claim(connection, worker="w", queues=["front"], n=500):
        pass
    _pending(3, age=0.5)
    with transaction.atomic():
        before = _returned()
        unbounded = claim.claim(connection, worker="w", queues=["front"], n=10)
        read_unbounded = _returned() - before
        transaction.set_rollback(True)
    since = min(c.run_at for c in unbounded if c.run_at is not None) - SLACK
    before = _returned()
    bounded = claim.claim(connection, worker="w", queues=["front"], n=10, since=since)
    read_bounded = _returned() - before
    assert sorted(c.id for c in bounded) == sorted(c.id for c in unbounded)
    assert len(bounded) == 3
    assert read_unbounded >= 2000, read_unbounded
    assert read_bounded <= 10, read_bounded


@pytest.mark.django_db
def test_the_queue_list_starts_at_the_bound_and_is_read_again_for_an_earlier_one() -> None:
    """A worker of every queue claims from the queues with pending jobs at or past its
    bound; a claim with an earlier bound (a sweep) reads the list again."""
    _pending(1, age=3600, queue="old")
    _pending(1, age=0, queue="new")
    with connection.cursor() as cursor:
        cursor.execute("SELECT now() - interval '60 seconds'")
        bound = cursor.fetchone()[0]
    assert pending_queues(connection, bound) == ["new"]
    assert pending_queues(connection) == ["new", "old"]
    state = Claimant(None, refresh=1e9, worker="w")
    state.keyed = False  # the test app's keyed tasks would make every claim limited
    assert state.claim_options(connection, bound)["queues"] == ["new"]
    assert state.claim_options(connection, bound + timedelta(seconds=1))["queues"] == ["new"]
    assert state.claim_options(connection, None)["queues"] == ["new", "old"]


@pytest.mark.django_db
def test_a_notified_queue_joins_the_queue_list_without_a_read() -> None:
    """A NOTIFY comes with a job of its queue: an every-queue worker adds the queue to
    its list instead of reading the list again (a read walks the claim index's entries
    before the bound); a reconnected LISTEN ("") makes it read the list again."""
    _pending(1, age=0, queue="new")
    state = Claimant(None, refresh=1e9, notified=True, worker="w")
    state.keyed = False
    assert state.claim_options(connection)["queues"] == ["new"]
    state.saw_queue("another")
    state.saw_queue("new")
    with CaptureQueriesContext(connection) as queries:
        assert state.claim_options(connection)["queues"] == ["another", "new"]
    assert len(queries) == 0
    state.saw_queue("")
    assert state.claim_options(connection)["queues"] == ["new"]


# -- with a worker -------------------------------------------------------------------------


@pytest.fixture
def worker_thread() -> Iterator[Worker]:
    yield from running_in_thread(
        Worker(queues=["front"], maintenance=False, concurrency=2, poll_interval=0.2)
    )


def _advanced(worker: Worker) -> datetime:
    """Jobs run until the worker's claims have a bound; the bound."""
    front = worker.claimant.front
    assert front is not None
    for _ in range(3):
        job = jobs.noop.using(queue="front").enqueue()
        wait_until(lambda job=job: job_status(job.id) == "completed", message="a job to run")
    wait_until(lambda: front.since() is not None, message="the bound to move")
    since = front.since()
    assert since is not None
    return since


@pytest.mark.django_db(transaction=True)
def test_a_job_enqueued_in_a_transaction_begun_long_ago_runs_at_once(worker_thread: Worker) -> None:
    """Its run_at (the transaction's start) lies behind the bound when it commits; its
    NOTIFY says so, and the next claim starts far enough back. Without that it would
    wait for the worker's next sweep (10 s)."""
    since = _advanced(worker_thread)
    job = jobs.noop.using(queue="front", run_at=since - timedelta(minutes=5)).enqueue()
    wait_until(lambda: job_status(job.id) == "completed", timeout=5, message="the late job to run")


@pytest.mark.django_db(transaction=True)
def test_a_job_behind_the_bound_that_nobody_announced_runs_at_the_next_sweep(
    worker_thread: Worker,
) -> None:
    """A row written without a NOTIFY that says when (raw SQL here, with no NOTIFY at
    all) is found when the worker reads the whole index again."""
    since = _advanced(worker_thread)
    job_id = unannounced("front", since - timedelta(minutes=5))
    wait_until(
        lambda: job_status(job_id) == "completed", timeout=25, message="the sweep to find it"
    )


@pytest.mark.django_db(transaction=True)
def test_a_job_behind_the_bound_that_nobody_announced_is_found_by_the_probe(
    probing_worker: Worker,
) -> None:
    """The same row as above, found by the maintenance thread's probe: within a few of
    its intervals, long before the claims' own sweep (UNPROBED_AFTER, 20 s) is due."""
    front = probing_worker.claimant.front
    assert front is not None and front.sweep_every == UNPROBED_AFTER
    since = _advanced(probing_worker)
    job_id = unannounced("front", since - timedelta(minutes=5))
    # A pending job of another queue before the bound is not this worker's.
    elsewhere = unannounced("not-front", since - timedelta(minutes=9))
    wait_until(lambda: job_status(job_id) == "completed", timeout=8, message="the probe to find it")
    wait_until(lambda: front.since() is not None, message="the bound to move again")
    assert probing_worker.counts["completed"] == 4
    assert job_status(elsewhere) == "pending"


@pytest.mark.django_db
def test_the_probe_reads_the_jobs_of_the_workers_queues_and_tasks() -> None:
    """FRONT_PROBE_*: the oldest pending run_at before the bound, in scope."""
    old = jobs.noop.using(queue="front", run_at=at(-60)).enqueue()
    jobs.noop.using(queue="front", run_at=at(-30)).enqueue()
    jobs.noop.using(queue="elsewhere", run_at=at(-90)).enqueue()
    jobs.add.using(queue="front", run_at=at(-120)).enqueue(1, 2)
    late = jobs.noop.using(queue="front", run_at=at(10)).enqueue()
    Job.objects.filter(id=old.id).update(status="completed", finished_at=at(0))
    noop, add = jobs.noop.definition.name, jobs.add.definition.name

    def oldest(since: datetime, queues: list[str] | None, tasks: list[str] | None) -> Any:
        return front_probe(connection, since, queues, tasks).oldest

    assert oldest(at(0), ["front"], None) == at(-120)
    assert oldest(at(0), ["front"], [noop]) == at(-30)
    assert oldest(at(0), None, [noop]) == at(-90)
    assert oldest(at(0), None, [noop, add]) == at(-120)
    assert oldest(at(-200), None, None) is None
    assert oldest(at(-30), ["front"], [noop]) is None  # strictly before
    Job.objects.filter(run_at__lt=at(0)).update(status="cancelled", finished_at=at(0))
    assert oldest(at(20), ["front"], [noop]) == late.run_at


@pytest.mark.django_db(transaction=True)
def test_the_front_compares_aware_times_when_use_tz_is_off() -> None:
    """Under ``USE_TZ = False`` Django loads timestamps naive; the NOTIFY's times are
    aware. The claim and the probe return run_at as epoch microseconds, so every
    time the front compares is aware UTC (a naive one raised TypeError there)."""
    with override_settings(USE_TZ=False):
        connection.close()  # a new connection, with Django's USE_TZ = False loaders
        job = jobs.noop.enqueue()
        Job.objects.filter(id=job.id).update(queue="front")
        with connection.cursor() as cursor:
            cursor.execute("SELECT run_at FROM django_pgjobs_job WHERE id = %s", [job.id])
            assert cursor.fetchone()[0].tzinfo is None  # the ORM's view: naive
            cursor.execute(f"UPDATE {JOB} SET run_at = %s WHERE id = %s", [at(-60), job.id])
        probed = front_probe(connection, at(0), ["front"], None).oldest
        [claimed] = claim.claim(connection, worker="w", queues=["front"], n=2)
        front = ClaimFront(sweep_every=1e9)
        assert front.bound() is None  # a claim begins (the first reads the whole index)
        front.heard(parse_payload(f"front,{int(at(-10).timestamp() * 1e6)},0").due)
        front.claimed([claimed.run_at], asked=2)  # type: ignore[list-item]
        front.probed(probed, began=0.0)
    connection.close()
    assert probed == claimed.run_at == at(-60)
    assert probed is not None and probed.utcoffset() == timedelta(0)
    assert front.since() == at(-60) - SLACK


@pytest.mark.django_db
@pytest.mark.parametrize("queues", [None, ["default"]], ids=["every-queue", "one-queue"])
def test_the_probe_checks_its_bound_on_the_claim_index_entries(queues: list[str] | None) -> None:
    """The probe reads the claim index and checks ``run_at < since`` on its entries, so
    the live backlog behind the bound costs no visit to its rows; history never. (The
    planner takes a bitmap scan here: it visits the rows found in page order.)"""
    fill_jobs(HISTORY, 1000)
    statement = FRONT_PROBE_ALL if queues is None else FRONT_PROBE_QUEUES
    params = {"since": datetime.now(UTC) - timedelta(minutes=5), "queues": queues, "tasks": None}
    plan = json.loads(explain_json(statement, params))
    scans = _index_scans(plan[0]["Plan"])
    assert {s["Index Name"] for s in scans} == {"pgjobs_job_claim_idx"}, plan
    # Before the bound: an index scan or a bitmap scan (which then visits the rows
    # found in page order). From the bound on (the priorities, and without queues the
    # queue list): loose index scans, each a probe that starts at its queue.
    assert sum("run_at <" in s["Index Cond"] for s in scans) == 1, plan
    assert all("run_at >=" in s["Index Cond"] for s in scans if "run_at <" not in s["Index Cond"])
    assert '"Seq Scan"' not in json.dumps(plan), plan


def _index_scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node] if "Index Name" in node else []
    for child in node.get("Plans", []):
        found += _index_scans(child)
    return found
