"""The worker's write path after errors, the hot cursor under
``execute_wrapper``, prepared statements, timeouts as options, and ``aenqueue``.

In-process, on the real database; faults are injected with Django's own
``connection.execute_wrapper`` (a statement that commits, then loses its reply).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

from django_pgjobs import JobTimeout, chain, claim, signals
from django_pgjobs.claim.plain import pending_queues
from django_pgjobs.db.job_insert import JOB_INSERT
from django_pgjobs.db.job_outcome import (
    JOB_COMPLETE_MANY,
    JOB_COMPLETE_MANY_REDO,
    JOB_RETRY,
    job_complete_many,
    job_dead,
    job_retry,
)
from django_pgjobs.models import Job, JobResult
from django_pgjobs.support.error_entries import error_entry
from django_pgjobs.support.throttle import Backoff
from django_pgjobs.worker import claimer as claimer_module
from django_pgjobs.worker import completer as completer_module
from django_pgjobs.worker import executor
from django_pgjobs.worker.claimer import ClaimSize
from django_pgjobs.worker.completer import Completer
from django_pgjobs.worker.executor import make_context
from django_pgjobs.worker.heartbeat import Heartbeat, WorkerRow
from django_pgjobs.worker.inflight import DONE, InFlight, InFlightTable
from django_pgjobs.worker.loop import Worker
from django_pgjobs.worker.outcomes import Outcome
from django_pgjobs.worker.running import JobRuns
from tests.helpers.lost_replies import lose_first_reply
from tests.testapp import core_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def received() -> Iterator[dict[str, list[dict[str, Any]]]]:
    got: dict[str, list[dict[str, Any]]] = {"succeeded": [], "fenced": [], "failed": [], "dead": []}
    receivers: list[Callable[..., None]] = []
    for name in got:

        def receiver(name: str = name, **kwargs: Any) -> None:
            got[name].append(kwargs)

        receivers.append(receiver)
        getattr(signals, f"job_{name}").connect(receiver, weak=False)
    yield got
    for name, receiver in zip(got, receivers, strict=True):
        getattr(signals, f"job_{name}").disconnect(receiver)


def test_a_batch_retried_after_a_lost_commit_reply_reports_each_job_exactly_once(
    received: dict[str, list[dict[str, Any]]],
) -> None:
    ids = [jobs.add.enqueue(i, i).id for i in range(3)]
    failing = jobs.always_fails.enqueue().id
    claimed = claim.claim(connection, worker="w", queues=None, n=10)
    assert {c.id for c in claimed} == {*ids, failing}
    worker = Worker(maintenance=False)
    batch = []
    for c in claimed:
        entry = InFlight(c, make_context(c, "w"), state=DONE)
        worker.inflight.add([entry])
        if c.id == failing:
            outcome = Outcome(
                "retry",
                error=error_entry(c.attempt, ValueError("boom"), "w"),
                delay=0.0,
                exception=ValueError("boom"),
            )
        else:
            outcome = Outcome("completed", value=c.args[0] * 2)
        batch.append((entry, outcome))
    with connection.execute_wrapper(lose_first_reply(JOB_COMPLETE_MANY, JOB_RETRY)):
        worker.completer.write_batch(connection, batch, Backoff("test"))
    assert received["fenced"] == []
    assert sorted(r["job_id"] for r in received["succeeded"]) == sorted(ids)
    assert [r["job_id"] for r in received["failed"]] == [failing]
    assert worker.counts["completed"] == 3 and worker.counts["retry"] == 1
    assert len(worker.inflight) == 0
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {"completed"}
    assert Job.objects.get(id=failing).status == "pending"


def test_outcome_writes_recognise_their_own_committed_write() -> None:
    a, b = jobs.noop.enqueue().id, jobs.noop.enqueue().id
    first, second = sorted(
        claim.claim(connection, worker="w", queues=None, n=2), key=lambda c: c.id
    )
    items = [(first.id, first.lease, None)]
    assert job_complete_many(connection, items) == {a}
    assert job_complete_many(connection, items) == {a}  # again: still ours, not fenced
    error = error_entry(second.attempt, ValueError("x"), "w")
    assert job_dead(connection, id=b, lease=second.lease, error=error)
    assert job_dead(connection, id=b, lease=second.lease, error=error)
    assert len(Job.objects.get(id=b).errors) == 1
    # Another lease is still fenced.
    assert job_complete_many(connection, [(a, first.lease + 1, None)]) == set()


def test_retry_never_leaves_a_row_pending_with_its_attempts_used_up() -> None:
    job = jobs.noop.using(max_attempts=1).enqueue()
    [c] = claim.claim(connection, worker="w", queues=None, n=1)
    assert job_retry(
        connection, id=job.id, lease=c.lease, delay=0, error=error_entry(1, ValueError("x"), "w")
    )
    job.refresh_from_db()
    assert job.status == "dead" and job.attempts == 1


def test_hot_cursor_honours_execute_wrappers() -> None:
    jobs.noop.enqueue()
    seen: list[str] = []

    def spy(
        execute: Callable[..., Any], sql_text: str, params: Any, many: bool, context: Any
    ) -> Any:
        seen.append(sql_text)
        return execute(sql_text, params, many, context)

    with connection.execute_wrapper(spy):
        claimed = claim.claim(connection, worker="w", queues=None, n=1)
        job_complete_many(connection, [(claimed[0].id, claimed[0].lease, None)])
        jobs.noop.enqueue()
    assert claim.claim_statements()["JOB_CLAIM_ALL"] in seen and JOB_COMPLETE_MANY_REDO in seen
    assert pending_queues(connection) == ["default"]
    assert JOB_INSERT in seen


def _prepared_names() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.parametrize("setting, expect", [("auto", True), (True, True), (False, False)])
def test_hot_statements_are_prepared_unless_told_not_to(
    settings: Any, setting: Any, expect: bool
) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "PREPARE": setting}
    connection.close()  # a fresh connection decides afresh
    jobs.noop.enqueue()
    claim.claim(connection, worker="w", queues=None, n=1)
    prepared = _prepared_names()
    assert any("pg_notify" in s and "INSERT INTO" in s for s in prepared) is expect
    assert any("SKIP LOCKED" in s for s in prepared) is expect
    connection.close()


def test_timeout_options_are_validated_and_stored() -> None:
    job = jobs.noop.using(timeout=timedelta(seconds=2.5)).enqueue()
    job.refresh_from_db()
    assert job.timeout == 2.5
    assert jobs.noop.enqueue().timeout is None
    with pytest.raises(ValueError, match="timeout"):
        jobs.noop.using(timeout=0)
    with pytest.raises(TypeError, match="timeout"):
        jobs.noop.using(timeout="5s")
    with pytest.raises(ValueError, match="timeout"):
        Job.objects.enqueue("tests.testapp.jobs.noop", timeout=-1)
    assert Job.objects.count() == 2
    assert core_jobs.sleeps_past_timeout.definition.effective_timeout(None) == 1.0
    assert core_jobs.sleeps_past_timeout.definition.effective_timeout(math.inf) is None
    assert core_jobs.sleeps_past_timeout.definition.effective_timeout(3.0) == 3.0
    assert jobs.noop.definition.effective_timeout(None) is None
    assert issubclass(JobTimeout, Exception)


def test_a_per_call_timeout_of_none_is_stored_as_no_limit_on_every_enqueue_path() -> None:
    # docs/reference/api.md: None = no limit. NULL would mean "not given" (the @job's 1 s applies),
    # so an explicit None is stored as Infinity, by every way a row is written.
    unlimited = core_jobs.sleeps_past_timeout.using(timeout=None)
    ids = [
        unlimited.enqueue().id,
        Job.objects.enqueue("tests.testapp.core_jobs.sleeps_past_timeout", timeout=None).id,
        chain(unlimited.s(0.1), unlimited.si(0.1)).enqueue().jobs[0].id,
    ]
    assert unlimited.enqueue_many([(0.1,), (0.2,)]) == 2
    stored = Job.objects.filter(task__endswith="sleeps_past_timeout").order_by("id")
    assert [j.timeout for j in stored] == [math.inf] * 6
    assert set(ids) < {j.id for j in stored}
    assert core_jobs.sleeps_past_timeout.using(max_attempts=1).enqueue().timeout is None


def test_default_timeout_setting_applies_to_jobs_without_their_own(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "DEFAULT_TIMEOUT": 7}
    assert jobs.noop.definition.effective_timeout(None) == 7.0
    assert core_jobs.sleeps_past_timeout.definition.effective_timeout(None) == 1.0


def test_aenqueue_from_async_code() -> None:
    async def main() -> tuple[Job, Job]:
        one = await jobs.add.aenqueue(1, 2)
        two = await Job.objects.aenqueue("tests.testapp.jobs.add", args=[3, 4])
        await sync_to_async(connections.close_all)()
        return one, two

    one, two = asyncio.run(main())
    assert Job.objects.filter(id__in=[one.id, two.id], status="pending").count() == 2


def test_claims_grow_with_fast_jobs_and_shrink_with_slow_ones() -> None:
    """The prefetch covers 20 ms of work at the observed job time, up to --batch, and a
    busy worker claims no fewer than a quarter of its threads plus prefetch: no-op jobs
    are claimed ~100 at a time (the claim's fixed cost spread thin), one-second jobs
    one thread's worth at a time (nothing hoarded that another worker could start)."""
    size = ClaimSize(concurrency=16, async_concurrency=100, batch=100)
    idle = (0, 0, 0)  # no slot taken, no outcome waiting
    assert size.prefetch() == 0 and size.min_claim() == 4  # no job time observed yet
    size.observe(50e-6, is_async=False)
    assert size.prefetch() == 100 and size.min_claim() == 29
    assert size.claimable(idle, has_loop=False) == 100  # idle: --batch
    size.job_time = 1.0
    assert size.prefetch() == 0 and size.min_claim() == 4
    assert size.claimable(idle, has_loop=False) == 16  # idle: one job per thread
    assert size.claimable((16, 0, 0), has_loop=False) == 0  # every thread busy
    assert size.claimable((0, 0, size.max_waiting), has_loop=False) == 0  # writes behind


def test_a_stale_heartbeat_never_cancels_the_next_claim_of_the_same_job() -> None:
    """The heartbeat reads the leases, then writes: a job that failed in between and was
    claimed again by this worker (a retry due at once) has a new lease, which is not
    lost; only a run holding the lease the heartbeat sent is cancelled. (Seen in CI: a
    false ``job_fenced`` for attempt 2 under load.)"""
    job = jobs.add.enqueue(1, 2)
    [first] = claim.claim(connection, worker="w-core", queues=[job.queue], n=1)
    stale_snapshot = [(first.id, first.lease)]
    assert (
        job_retry(
            connection,
            id=first.id,
            lease=first.lease,
            delay=0,
            error=error_entry(first.attempt, ValueError("boom"), "w-core"),
        )
        == "pending"
    )
    [second] = claim.claim(connection, worker="w-core", queues=[job.queue], n=1)
    assert second.lease != first.lease
    table = InFlightTable()
    entry = InFlight(claimed=second, context=make_context(second, "w-core"))
    table.add([entry])

    class StaleLeases:
        """The table, but read before the retry and the new claim."""

        def leases(self) -> list[tuple[int, int]]:
            return stale_snapshot

        def lease_lost(self, job_id: int, lease: int) -> Any:
            return table.lease_lost(job_id, lease)

    row = WorkerRow(id="w-core", queues=None, concurrency=1, tasks=[])
    beat = Heartbeat(jobs=StaleLeases(), row=row, alias="default", interval=1)
    lost = beat.beat(connections["default"])
    assert lost == [(first.id, first.lease)]  # the statement saw the old lease gone
    fenced: list[dict[str, Any]] = []

    def on_fenced(**kwargs: Any) -> None:
        fenced.append(kwargs)

    signals.job_fenced.connect(on_fenced, weak=False)
    try:
        beat.report_lost(lost)
    finally:
        signals.job_fenced.disconnect(on_fenced)
    assert not entry.context.is_cancelled()
    assert fenced == []
    # The run that did hold a lost lease is still cancelled, and reported once.
    assert table.lease_lost(second.id, second.lease) is second
    assert entry.context.is_cancelled()


def test_a_stopping_worker_waits_for_outcomes_not_yet_on_the_completers_queue() -> None:
    """A run the watchdog has just timed out (or a job thread has just finished) is no
    longer running, but its outcome reaches the completer a moment later: until then
    it is unsettled, so a stopping worker's drain waits for it instead of closing the
    completer first (the fault suite's restart test lost a timeout that way: the job
    stayed running, left to the reaper)."""
    jobs.noop.enqueue()
    jobs.noop.enqueue()
    first, second = claim.claim(connection, worker="w", queues=None, n=2)
    table = InFlightTable()
    done = InFlight(first, make_context(first, "w"))
    timed = InFlight(second, make_context(second, "w"), timeout=0.1)
    table.add([done, timed])
    assert table.start(done) and table.start(timed)
    assert table.finish(done)
    assert table.expire(time.monotonic() + 10) == [timed]
    assert set(table.unsettled()) == {done, timed}
    completer = Completer(table=table, counts={}, wake=lambda: None, worker_id="w", alias="default")
    completer.put(done, executor.timed_out(first, 0.1, "w"))
    assert table.unsettled() == [timed]
    completer.put(timed, executor.timed_out(second, 0.1, "w"))
    assert table.unsettled() == []


def test_large_results_are_written_in_several_batches_and_none_is_lost(
    transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The completer stops a batch once its results pass ``BATCH_BYTES``: a worker whose
    jobs return large values writes them in several statements instead of one holding
    them all (with its copies in the driver), and still writes every one of them."""
    monkeypatch.setattr(completer_module, "BATCH_BYTES", 500)
    ids = [jobs.add.enqueue(i, i).id for i in range(5)]
    claimed = claim.claim(connection, worker="w", queues=None, n=10)
    worker = Worker(maintenance=False)
    sizes: list[int] = []
    write_batch = worker.completer.write_batch

    def recorded(connection: Any, batch: Any, backoff: Backoff) -> None:
        sizes.append(len(batch))
        write_batch(connection, batch, backoff)

    monkeypatch.setattr(worker.completer, "write_batch", recorded)
    for c in claimed:
        entry = InFlight(c, make_context(c, "w"), state=DONE)
        worker.inflight.add([entry])
        value = f"{c.id:0>200}"
        worker.completer.put(entry, Outcome("completed", value=value, encoded=f'"{value}"'))
    worker.completer.close()
    worker.completer.run()
    assert sizes == [3, 2]  # 202 + 202 + 202 characters pass 500: the third ends a batch
    assert worker.counts["completed"] == 5 and len(worker.inflight) == 0
    rows = dict(JobResult.objects.filter(job_id__in=ids).values_list("job_id", "value"))
    assert rows == {i: f"{i:0>200}" for i in ids}


def test_claiming_pauses_while_large_results_wait_for_the_completer(
    transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outcomes waiting for the completer are bounded in bytes as well as in number: a
    worker whose jobs return large values stops claiming until they are written, so
    they cannot pile up in its memory (or stall its completions until it is taken for
    lost)."""
    monkeypatch.setattr(claimer_module, "MAX_WAITING_BYTES", 1000)
    worker = Worker(maintenance=False)
    runs = JobRuns(
        table=worker.inflight,
        hand_over=worker.completer.put,
        observe=worker.claimer.size.observe,
        wake=worker.claimer.wake,
        run_over=worker.completer.run_over,
        worker_id="w",
        alias="default",
        concurrency=4,
        async_concurrency=1,
        use_async=False,
    )
    try:
        assert worker.claimer.claimable(runs) > 0
        ids = [jobs.add.enqueue(i, i).id for i in range(2)]
        for c in claim.claim(connection, worker="w", queues=None, n=2):
            entry = InFlight(c, make_context(c, "w"), state=DONE)
            worker.inflight.add([entry])
            value = "x" * 600
            worker.completer.put(entry, Outcome("completed", value=value, encoded=f'"{value}"'))
        assert worker.inflight.waiting_bytes == 1204
        assert worker.claimer.claimable(runs) == 0
        worker.completer.close()
        worker.completer.run()
        assert worker.inflight.waiting_bytes == 0
        assert worker.claimer.claimable(runs) > 0
        assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {"completed"}
    finally:
        runs.stop(wait=True)
