"""The claim front's seek by priority (``claim/front.py``): past the bound, a worker's
claims start each priority's scan of the claim index at the bound, instead of stepping
over the entries of every job claimed since VACUUM last ran."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction

from django_pgjobs import claim
from django_pgjobs.claim.front import ClaimFront
from django_pgjobs.claim.probe import Probed, front_probe
from django_pgjobs.db.tables import JOB
from django_pgjobs.models import Job
from django_pgjobs.worker import Worker
from tests.conftest import wait_until
from tests.helpers.claim_front import job_status, unannounced
from tests.testapp import jobs

# -- the rules ---------------------------------------------------------------------------


# -- the statements ----------------------------------------------------------------------


def _insert(queue: str, priority: int, run_at: datetime | str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {JOB} (task, queue, priority, args, kwargs, max_attempts, run_at)"
            " VALUES ('tests.testapp.jobs.noop', %s, %s, '[]', '{}', 3, %s) RETURNING id",
            [queue, priority, run_at],
        )
        return int(cursor.fetchone()[0])


def _now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        value: datetime = cursor.fetchone()[0]
    return value


@pytest.mark.django_db
def test_a_claim_by_level_takes_the_best_jobs_of_the_levels_named_from_the_bound() -> None:
    now = _now()
    since = now - timedelta(minutes=10)
    before = _insert("a", 5, since - timedelta(seconds=1))  # before the bound
    low = _insert("a", -3, now - timedelta(minutes=5))  # a level not named
    a0 = _insert("a", 0, now - timedelta(minutes=4))
    b0 = _insert("b", 0, now - timedelta(minutes=6))
    a5 = _insert("a", 5, now - timedelta(minutes=1))
    b5 = _insert("b", 5, now - timedelta(minutes=2))
    _insert("c", 5, now - timedelta(minutes=3))  # a queue not named
    _insert("a", 5, now + timedelta(minutes=1))  # not due
    take = claim.claim(connection, worker="w", queues=["a", "b"], n=3, since=since, levels=(5, 0))
    assert {c.id for c in take} == {b5, a5, b0}  # the best three (rows come in id order)
    rest = claim.claim(connection, worker="w", queues=["a", "b"], n=9, since=since, levels=(5, 0))
    assert [c.id for c in rest] == [a0]
    assert Job.objects.filter(id__in=[before, low], status="pending").count() == 2
    # The known-task form filters by task as the other known-task claims do.
    _insert("a", 0, now)
    assert (
        claim.claim(
            connection, worker="w", queues=["a"], n=9, since=since, levels=(0,), tasks=["other"]
        )
        == []
    )
    assert (
        len(
            claim.claim(
                connection,
                worker="w",
                queues=["a"],
                n=9,
                since=since,
                levels=(0,),
                tasks=["tests.testapp.jobs.noop"],
            )
        )
        == 1
    )


def _index_blocks() -> int:
    """Claim-index blocks read (from cache or disk) so far in this transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_blocks_fetched('pgjobs_job_claim_idx'::regclass)")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db
def test_a_claim_by_level_seeks_past_the_entries_of_the_jobs_claimed_before() -> None:
    """The entries of claimed jobs stay in the claim index until VACUUM (here: claimed in
    this transaction, so nothing can remove them, as under a held horizon). A bounded
    claim checks each of them on its entry, page after page; one by level starts at the
    bound."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {JOB} (task, queue, priority, args, kwargs, max_attempts, run_at)"
            " SELECT 'tests.testapp.jobs.noop', 'front', 0, '[]', '{}', 3,"
            "        now() - interval '1 hour' + g * interval '1 millisecond'"
            "   FROM generate_series(1, 20000) AS g"
        )
    while claim.claim(connection, worker="w", queues=["front"], n=1000):
        pass
    fresh = [_insert("front", 0, _now() - timedelta(seconds=1)) for _ in range(3)]
    since = _now() - timedelta(seconds=30)
    with transaction.atomic():
        before = _index_blocks()
        bounded = claim.claim(connection, worker="w", queues=["front"], n=10, since=since)
        walked = _index_blocks() - before
        transaction.set_rollback(True)
    before = _index_blocks()
    sought = claim.claim(connection, worker="w", queues=["front"], n=10, since=since, levels=(0,))
    seek = _index_blocks() - before
    assert sorted(c.id for c in sought) == sorted(c.id for c in bounded) == fresh
    assert walked >= 40, walked  # 20,000 entries: some 60 leaf pages
    assert seek <= 6, seek


@pytest.mark.django_db
def test_the_probe_reads_the_priorities_from_the_bound_or_the_oldest_job_before_it() -> None:
    now = _now()
    _insert("front", 3, now - timedelta(minutes=30))  # before the bound: found...
    _insert("front", 9, now - timedelta(minutes=20))  # ...and so at or past the oldest
    _insert("front", 0, now)
    _insert("front", -5, now + timedelta(hours=1))  # not due: a level all the same
    _insert("front", 9, now)
    _insert("elsewhere", 50, now)
    done = _insert("front", 70, now)
    Job.objects.filter(id=done).update(status="completed", finished_at=now)
    since = now - timedelta(minutes=25)
    found = front_probe(connection, since, ["front"], None)
    assert found.oldest == now - timedelta(minutes=30)
    assert found.levels == (9, 3, 0, -5)
    assert front_probe(connection, since, None, None).levels == (50, 9, 3, 0, -5)
    assert front_probe(connection, since, ["front"], ["other"]) == Probed(None, ())
    later = front_probe(connection, now - timedelta(minutes=1), ["front", "elsewhere"], None)
    assert later.oldest == now - timedelta(minutes=30)  # the bound moves back to it
    _insert("front", 1, now - timedelta(minutes=40))
    assert front_probe(connection, now, ["front"], None).levels == (9, 3, 1, 0, -5)


# -- with a worker -------------------------------------------------------------------------


def _seeking(worker: Worker) -> ClaimFront:
    """Jobs run until the worker's claims seek by level; its front."""
    front = worker.claimant.front
    assert front is not None
    deadline = time.monotonic() + 15
    while front.levels() is None:
        assert time.monotonic() < deadline, "the claims never began to seek by level"
        job = jobs.noop.using(queue="front").enqueue()
        wait_until(lambda job=job: job_status(job.id) == "completed", message="a job to run")
    return front


@pytest.mark.django_db(transaction=True)
def test_a_job_at_a_new_priority_runs_at_once_when_announced_and_soon_when_not(
    probing_worker: Worker,
) -> None:
    front = _seeking(probing_worker)
    assert front.levels() == (0,)
    urgent = jobs.noop.using(queue="front", priority=40).enqueue()  # its NOTIFY says 40
    wait_until(lambda: job_status(urgent.id) == "completed", timeout=5, message="the urgent job")
    assert 40 in (front.levels() or ())
    # Written by hand, no NOTIFY: the levels' probe finds its priority.
    job_id = unannounced("front", _now(), priority=-60)
    wait_until(lambda: job_status(job_id) == "completed", timeout=8, message="the probe to find it")
    assert front.levels() == (40, 0, -60)
