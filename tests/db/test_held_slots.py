"""Held limit slots (``db/held_slots.py``; docs/explanation/guarantees.md): each
statement that writes off a running row records its run's slot in the same
statement; the limited claim counts the slots; the worker gives a slot back only
once the write-off is known and the run has really ended; the reaper gives back
the slots of workers that are gone. Process-level proof: test_held_slots_process.py.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgjobs.claim.limited import job_claim_limited
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.held_slots import held_slot_free
from django_pgjobs.db.job_admin import job_cancel, job_retry_now
from django_pgjobs.db.job_outcome import job_release, job_retry, job_timed_out
from django_pgjobs.db.reap import job_reap_stale
from django_pgjobs.db.workers import WORKER_DELETE
from django_pgjobs.jobs.context import JobContext
from django_pgjobs.maintenance.reaper import Reaper
from django_pgjobs.models import HeldSlot, Job, Queue
from django_pgjobs.models import Worker as WorkerRow
from django_pgjobs.support.throttle import Backoff
from django_pgjobs.worker import executor
from django_pgjobs.worker.completer import Completer
from django_pgjobs.worker.inflight import InFlight, InFlightTable
from django_pgjobs.worker.loop import Worker
from django_pgjobs.worker.outcomes import Outcome
from tests import flow_keyed_jobs
from tests.conftest import wait_until
from tests.helpers import run_records
from tests.helpers.rows import make_job

ERROR = {"attempt": 1, "type": "builtins.ValueError", "message": "boom", "traceback": "tb"}
TASK = "tests.testapp.jobs.add"
COUNTS = dict.fromkeys(("completed", "retry", "dead", "fenced", "released", "timed_out"), 0)


def running(key: str | None = "k", *, queue: str = "default", worker: str = "w1", **kw: Any) -> Job:
    """A running row claimed by ``worker`` (lease 1), with a concurrency key (limit 1)."""
    job = make_job("running", queue=queue, **kw)
    Job.objects.filter(id=job.id).update(
        worker=worker, concurrency_key=key, concurrency_limit=1 if key else None
    )
    job.refresh_from_db()
    return job


def slots() -> set[tuple[int, int, str, str, str | None]]:
    return set(
        HeldSlot.objects.values_list("job_id", "lease", "worker", "queue", "concurrency_key")
    )


def timed_out(job: Job, *, lease: int = 1, retry: bool = True) -> str | None:
    return job_timed_out(connection, id=job.id, lease=lease, retry=retry, delay=0, error=ERROR)


def seen(worker: str, age: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_pgjobs_worker (id, host, pid, queues, concurrency, started_at,"
            " last_seen) VALUES (%s, 'h', 1, '[]', 1, now(), now() - make_interval(secs => %s))",
            [worker, age],
        )


def age_slots(seconds: float) -> None:
    HeldSlot.objects.update(since=timezone.now() - timedelta(seconds=seconds))


# ---------------------------------------------------------------- written off


@pytest.mark.django_db
def test_a_timed_out_keyed_run_holds_its_slot_under_its_own_lease() -> None:
    job = running("k")
    assert timed_out(job) == "pending"
    job.refresh_from_db()
    assert job.lease == 2  # the write bumped it; the slot is the run's (lease 1)
    assert slots() == {(job.id, 1, "w1", "default", "k")}


@pytest.mark.django_db
def test_only_runs_that_matter_to_a_limit_hold_a_slot() -> None:
    plain = running(None, queue="free")
    capped = running(None, queue="capped")
    Queue.objects.create(name="capped", max_running=2)
    timed_out(plain)
    timed_out(capped)
    assert slots() == {(capped.id, 1, "w1", "capped", None)}


@pytest.mark.django_db
def test_a_fenced_or_redone_timed_out_write_holds_no_second_slot() -> None:
    job = running("k")
    assert timed_out(job, lease=7) is None  # not ours: nothing written, nothing held
    assert slots() == set()
    error = {**ERROR, "at": "2030-01-01T00:00:00+00:00", "worker": "w1"}
    for _ in range(2):  # the second is a redo after a lost reply: it recognises its write
        assert job_timed_out(connection, id=job.id, lease=1, retry=True, delay=0, error=error)
    assert len(slots()) == 1


@pytest.mark.django_db
def test_a_run_released_at_shutdown_while_it_goes_on_holds_its_slot() -> None:
    going, queued = running("k"), running("k2")
    assert job_release(connection, id=going.id, lease=1, still_running=True)
    assert job_release(connection, id=queued.id, lease=1)  # never started: nothing held
    assert slots() == {(going.id, 1, "w1", "default", "k")}


@pytest.mark.django_db
def test_a_failed_attempt_holds_nothing() -> None:
    job = running("k")
    assert job_retry(connection, id=job.id, lease=1, delay=0, error=ERROR) == "pending"
    assert slots() == set()  # the run ended: it returned its failure


@pytest.mark.django_db
def test_cancelling_a_running_keyed_job_holds_its_slot_a_pending_one_not() -> None:
    run = running("k")
    waiting = make_job("pending")
    Job.objects.filter(id=waiting.id).update(concurrency_key="k", concurrency_limit=1)
    assert job_cancel(connection, [run.id, waiting.id]) == {run.id, waiting.id}
    assert slots() == {(run.id, 1, "w1", "default", "k")}


@pytest.mark.django_db
def test_retrying_a_stuck_running_keyed_job_holds_its_slot() -> None:
    stuck = running("k", heartbeat_age=3600)
    assert job_retry_now(connection, [stuck.id], stale_after=30).changed == {stuck.id}
    assert slots() == {(stuck.id, 1, "w1", "default", "k")}


@pytest.mark.django_db
def test_the_reaper_holds_the_slots_of_the_runs_it_reclaims() -> None:
    stale = running("k", heartbeat_age=3600)
    plain = running(None, heartbeat_age=3600)
    rows = job_reap_stale(connection, stale_after=30)
    assert {r[0] for r in rows} == {stale.id, plain.id}
    assert slots() == {(stale.id, 1, "w1", "default", "k")}


@pytest.mark.django_db
def test_the_reaper_gives_back_the_slots_of_workers_that_are_gone() -> None:
    for worker in ("gone", "alive", "missing"):
        timed_out(running("k", worker=worker))
    seen("gone", 60)
    seen("alive", 0)
    age_slots(60)
    # A slot written off just now, by a worker never seen: it has STALE_AFTER to say
    # its run ended (a frozen worker that comes back).
    young = running("k", worker="missing-but-young")
    timed_out(young)
    job_reap_stale(connection, stale_after=30)
    assert {s[2] for s in slots()} == {"alive", "missing-but-young"}


@pytest.mark.django_db
def test_a_frozen_worker_keeps_an_old_slot_for_twice_stale_after() -> None:
    """A slot written off before its worker froze (a timeout) is old already: it is
    kept while the worker was seen within 2 x STALE_AFTER, like a reclaimed run's, and
    the reaper does not forget the worker's row before then (model test, seed
    206281739: it went after STALE_AFTER of freeze, and the next run of the key
    started beside the thawed thread)."""
    for worker in ("frozen-45s", "frozen-75s"):
        timed_out(running("k", worker=worker))
    seen("frozen-45s", 45)
    seen("frozen-75s", 75)
    age_slots(600)  # written off long before the freeze
    job_reap_stale(connection, stale_after=30)
    assert {s[2] for s in slots()} == {"frozen-45s"}
    Reaper(stale_after=30).run_once()
    assert set(WorkerRow.objects.values_list("id", flat=True)) == {"frozen-45s"}
    assert {s[2] for s in slots()} == {"frozen-45s"}


# ---------------------------------------------------------------- given back


@pytest.mark.django_db
def test_a_worker_gives_back_only_the_slot_of_that_very_run() -> None:
    job = running("k")
    timed_out(job)
    assert held_slot_free(connection, worker="w2", runs=[(job.id, 1)]) == 0
    assert held_slot_free(connection, worker="w1", runs=[(job.id, 3)]) == 0  # a later run
    assert held_slot_free(connection, worker="w1", runs=[(job.id, 1)]) == 1
    assert held_slot_free(connection, worker="w1", runs=[(job.id, 1)]) == 0  # repeated: no-op
    assert slots() == set()


@pytest.mark.django_db
def test_a_worker_exit_gives_back_its_slots_only() -> None:
    mine, theirs = running("a", worker="w1"), running("b", worker="w2")
    timed_out(mine)
    timed_out(theirs)
    seen("w1", 0)
    with connection.cursor() as cursor:
        cursor.execute(WORKER_DELETE, {"id": "w1"})
    assert {s[2] for s in slots()} == {"w2"}


# ---------------------------------------------------------------- counted


def claim(queues: list[str] | None = None) -> list[int]:
    rows = job_claim_limited(connection, worker="w9", queues=queues, n=10, tasks=[TASK])
    return [c.id for c in rows]


@pytest.mark.django_db
def test_the_limited_claim_counts_a_held_key_slot() -> None:
    old = running("k")
    timed_out(old, retry=False)  # dead; its thread runs on
    blocked = make_job("pending")
    other = make_job("pending")
    Job.objects.filter(id=blocked.id).update(concurrency_key="k", concurrency_limit=1)
    Job.objects.filter(id=other.id).update(concurrency_key="other", concurrency_limit=1)
    assert claim() == [other.id]  # the held key waits; another key flows
    held_slot_free(connection, worker="w1", runs=[(old.id, 1)])
    assert claim() == [blocked.id]


@pytest.mark.django_db
def test_the_limited_claim_counts_a_held_max_running_slot() -> None:
    Queue.objects.create(name="capped", max_running=2)
    old = running(None, queue="capped")
    timed_out(old, retry=False)
    still = running(None, queue="capped", worker="w3")
    waiting = [make_job("pending", queue="capped").id for _ in range(2)]
    assert claim(["capped"]) == []  # one running + one held = 2
    held_slot_free(connection, worker="w1", runs=[(old.id, 1)])
    assert claim(["capped"]) == waiting[:1]
    assert Job.objects.get(id=still.id).status == "running"


@pytest.mark.django_db
def test_a_retried_job_waits_for_the_slot_of_its_own_earlier_run() -> None:
    job = running("k")
    assert timed_out(job) == "pending"  # retried at once, its old thread still running
    assert claim() == []
    held_slot_free(connection, worker="w1", runs=[(job.id, 1)])
    assert claim() == [job.id]


# ---------------------------------------------------------------- the worker


def in_flight(job: Job) -> InFlight:
    claimed = Claimed(
        id=job.id,
        task=job.task,
        args=[1, 2],
        kwargs={},
        attempt=1,
        max_attempts=job.max_attempts,
        lease=1,
        queue=job.queue,
        priority=0,
        idempotency_key=None,
        timeout=0.1,
    )
    context = JobContext(
        job_id=job.id,
        task=job.task,
        attempt=1,
        max_attempts=job.max_attempts,
        lease=1,
        queue=job.queue,
        worker="w1",
    )
    return InFlight(claimed, context, timeout=0.1, state="timed_out")


def test_the_late_write_of_an_earlier_run_leaves_the_new_entry_of_its_job() -> None:
    # A job retried after its timeout and claimed again by the same worker before the
    # timed-out write was reported: that report must not drop the new run's entry
    # (it would stop being heartbeated, and be reclaimed while it runs).
    job = Job(id=5, task=TASK, queue="default", max_attempts=5)
    table = InFlightTable()
    old, new = in_flight(job), in_flight(job)
    table.add([old])
    table.add([new])
    table.remove(old)
    table.forget([old])
    assert table.ids() == [5] and table.leases() == [(5, 1)] and table.unwritten == 0
    table.remove(new)
    assert table.ids() == []


def completer_of(worker: str) -> Completer:
    return Completer(
        table=InFlightTable(),
        counts=COUNTS.copy(),
        wake=lambda: None,
        worker_id=worker,
        alias="default",
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("run_ends_first", [True, False])
def test_the_completer_gives_a_slot_back_after_the_write_off_and_the_runs_end(
    run_ends_first: bool,
) -> None:
    job = running("k")
    entry = in_flight(job)
    completer = completer_of("w1")
    outcome = executor.timed_out(entry.claimed, 0.1, "w1")
    backoff = Backoff("test")
    if run_ends_first:  # the thread returned before the timed-out write was made
        completer.write_batch(connection, [(entry, None), (entry, outcome)], backoff)
        assert slots() == set()  # written, then given back at once
    else:
        completer.write_batch(connection, [(entry, outcome)], backoff)
        assert slots() == {(job.id, 1, "w1", "default", "k")}  # the thread runs on
        completer.write_batch(connection, [(entry, None)], backoff)
        assert slots() == set()
    assert Job.objects.get(id=job.id).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_the_completer_gives_back_the_slot_of_a_run_cancelled_meanwhile() -> None:
    job = running("k")
    entry = in_flight(job)
    entry.state = "done"
    job_cancel(connection, [job.id])  # the run returned; its outcome is fenced
    completer = completer_of("w1")
    completer.write_batch(connection, [(entry, Outcome("completed", value=3))], Backoff("test"))
    assert completer.counts["fenced"] == 1
    assert slots() == set()


@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_the_slot_of_a_timed_out_run_until_its_thread_ends() -> None:
    run_records.create()
    sleeper = flow_keyed_jobs.keyed_sleeper.using(timeout=0.3, max_attempts=1)
    job = sleeper.enqueue("w", 1.5)
    worker = Worker(concurrency=2, maintenance=False, listen=False, poll_interval=0.1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: Job.objects.get(id=job.id).status == "dead", message="timed out")
        assert slots() == {(job.id, 1, worker.id, "slots-keyed", "slots:w")}
        assert run_records.unfinished("slots:w") == 1
        # The first moment the slot is gone, the thread has already ended.
        wait_until(lambda: not HeldSlot.objects.exists(), message="slot given back")
        assert run_records.unfinished("slots:w") == 0
        assert run_records.runs("slots:w")[0][2] == job.id
    finally:
        worker.request_stop()
        thread.join(20)
    assert not thread.is_alive()
