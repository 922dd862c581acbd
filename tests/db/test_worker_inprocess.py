"""The Worker class run in a thread of the test process, on the real database.

Covers the outcome paths (complete, retry with backoff, dead letter, discard_on,
retry_on, unknown task, bad return value), JobContext, atomic jobs, the
idempotency short-circuit, heartbeats, lease loss, the Worker row and logging.
Crash and signal behaviour is in test_process.py (real subprocesses).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_pgjobs import claim, signals
from django_pgjobs.db.job_admin import job_cancel
from django_pgjobs.models import Job, JobResult
from django_pgjobs.models import Worker as WorkerRow
from django_pgjobs.states import JobStatus
from django_pgjobs.support.retry import backoff
from django_pgjobs.worker.loop import DEFAULT_CONCURRENCY, Worker
from tests.conftest import run_burst_worker, wait_until
from tests.helpers.rows import make_job
from tests.testapp import core_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def running(**options: Any) -> Iterator[Worker]:
    """A Worker running in a background thread; stopped (gracefully) on exit."""
    options.setdefault("maintenance", False)
    options.setdefault("poll_interval", 0.1)
    worker = Worker(**options)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(20)
        assert not thread.is_alive(), "worker did not stop"
        assert result == [0]


def run_burst(**options: Any) -> Worker:
    """Run a burst worker to completion in a thread (with a deadline)."""
    options.setdefault("maintenance", False)
    worker = Worker(burst=True, **options)
    run_burst_worker(worker)
    return worker


def status_of(job: Job) -> str:
    job.refresh_from_db()
    return job.status


def wait_status(job: Job, *statuses: str, timeout: float = 15) -> Job:
    wait_until(
        lambda: status_of(job) in statuses,
        timeout=timeout,
        message=f"job {job.id} to reach {statuses}",
    )
    return job


def test_burst_completes_jobs_and_stores_results() -> None:
    a = jobs.add.enqueue(2, 3)
    e = jobs.send_email.enqueue("x@y.z")
    n = jobs.noop.enqueue()
    worker = run_burst()
    assert worker.counts["completed"] == 3
    for job in (a, e, n):
        job.refresh_from_db()
        assert (job.status, job.attempts, job.finished_at is not None) == ("completed", 1, True)
    assert a.result == 5 and e.result == {"to": "x@y.z", "subject": "hi"}
    assert not JobResult.objects.filter(job_id=n.id).exists()  # None, no key: nothing stored
    assert not WorkerRow.objects.exists()


def test_retries_with_backoff_until_success(tmp_path: Path) -> None:
    job = jobs.flaky_until.enqueue(str(tmp_path / "runs"), 3)
    with running():
        wait_status(job, "completed")
    assert job.attempts == 3 and job.result == 3
    assert [e["attempt"] for e in job.errors] == [1, 2]
    assert all(
        e["type"] == "builtins.RuntimeError" and "Traceback" in e["traceback"] for e in job.errors
    )


def test_dead_letter_when_attempts_run_out() -> None:
    job = jobs.always_fails.enqueue("kaput")
    with running() as worker:
        wait_status(job, "dead")
    assert job.attempts == 3 == len(job.errors)
    assert job.last_error == "builtins.ValueError: kaput"
    assert worker.counts["retry"] == 2 and worker.counts["dead"] == 1


def test_retry_run_at_follows_full_jitter_backoff() -> None:
    job = jobs.always_fails.using(max_attempts=5).enqueue()
    [claimed] = claim.claim(connection, worker="w", queues=["default"], n=1)
    from django_pgjobs.worker import outcomes
    from django_pgjobs.worker.executor import execute

    outcome = execute(claimed, worker="w", alias="default")
    assert outcome.kind == "retry" and 0 <= outcome.delay <= 0.05  # BACKOFF_BASE * 2**0
    assert outcomes.write(connection, claimed, outcome)
    job.refresh_from_db()
    assert job.status == "pending" and job.run_at >= job.started_at


def test_backoff_is_full_jitter_bounded_by_cap() -> None:
    rng = random.Random(7)
    for attempt in range(1, 80):
        ceiling = min(60.0, 1.0 * 2 ** (attempt - 1))
        samples = [backoff(attempt, base=1.0, cap=60.0, rand=rng) for _ in range(200)]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling * 0.8 and min(samples) < ceiling * 0.2  # full spread


def test_discard_on_goes_straight_to_dead() -> None:
    job = jobs.discard_me.enqueue()
    with running():
        wait_status(job, "dead")
    assert job.attempts == 1 and job.errors[0]["type"].endswith("Permanent")


def test_retry_on_retries_only_listed_exceptions() -> None:
    other = jobs.retry_only_transient.enqueue("other")
    transient = jobs.retry_only_transient.using(max_attempts=2).enqueue("transient")
    with running():
        wait_status(other, "dead")
        wait_status(transient, "dead")
    assert other.attempts == 1
    assert transient.attempts == 2 and len(transient.errors) == 2


def test_unknown_task_is_left_pending_without_import() -> None:
    # Deploy skew (docs/howto/upgrade.md): a worker never claims a task it does not know; the job
    # waits (tests/db/test_flow.py covers the dead letter after UNKNOWN_TASK_TIMEOUT).
    job = jobs.noop.enqueue()
    Job.objects.filter(id=job.id).update(task="os.system")
    other = jobs.noop.enqueue()
    run_burst()
    job.refresh_from_db()
    other.refresh_from_db()
    assert other.status == "completed"
    assert job.status == "pending" and job.attempts == 0 and job.errors == []


def test_bad_return_value_is_dead_not_retried() -> None:
    job = jobs.returns_set.using(max_attempts=3).enqueue()
    run_burst()
    job.refresh_from_db()
    assert job.status == "dead" and job.attempts == 1 and "JSON" in job.last_error


def test_takes_context_gets_its_job_context() -> None:
    job = jobs.whoami.using(idempotency_key="ctx-1").enqueue()
    run_burst()
    assert job.__class__.objects.get(id=job.id).result == {
        "job_id": job.id,
        "attempt": 1,
        "lease": 1,
        "key": "ctx-1",
    }


def test_no_transaction_is_open_while_a_job_runs() -> None:
    job = jobs.report_transactions.enqueue()
    jobs.sleep_then_mark.enqueue(0.5, "/dev/null")  # another job in flight meanwhile
    run_burst(concurrency=2)
    job.refresh_from_db()
    assert job.result == {"in_atomic_block": False, "idle_in_tx": 0, "autocommit": True}


def test_atomic_job_commits_handler_writes_with_completion() -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE wk_atomic (job_id bigint, lease bigint)")
    try:
        job = jobs.atomic_insert.enqueue("wk_atomic", 0)
        run_burst()
        job.refresh_from_db()
        assert job.status == "completed" and job.result == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT job_id, lease FROM wk_atomic")
            assert cursor.fetchall() == [(job.id, 1)]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE wk_atomic")


def test_atomic_job_cancelled_mid_run_rolls_back_its_writes() -> None:
    fenced: list[dict[str, Any]] = []

    def on_fenced(**kwargs: Any) -> None:
        fenced.append(kwargs)

    signals.job_fenced.connect(on_fenced)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE wk_atomic2 (job_id bigint, lease bigint)")
    try:
        job = jobs.atomic_insert.enqueue("wk_atomic2", 1.5)
        with running():
            wait_status(job, "running")
            assert job_cancel(connection, [job.id]) == {job.id}
            wait_until(
                lambda: any(f["job_id"] == job.id for f in fenced),
                timeout=10,
                message="the fenced signal",
            )
        job.refresh_from_db()
        assert job.status == "cancelled" and job.lease == 2
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM wk_atomic2")
            assert cursor.fetchone()[0] == 0
        assert not JobResult.objects.filter(job_id=job.id).exists()
    finally:
        signals.job_fenced.disconnect(on_fenced)
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE wk_atomic2")


def test_idempotency_short_circuit_skips_a_second_run(tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    first = jobs.flaky_until.using(idempotency_key="once").enqueue(str(marker), 1)
    run_burst()
    assert first.__class__.objects.get(id=first.id).status == "completed"
    Job.objects.filter(id=first.id).delete()  # pruned; the result keeps the key
    again = jobs.flaky_until.using(idempotency_key="once").enqueue(str(marker), 1)
    assert again.id != first.id
    run_burst()
    again.refresh_from_db()
    assert again.status == "completed" and again.result is None  # no second result row
    assert marker.read_text() == "x", "the handler ran twice"


def test_heartbeat_refreshes_running_jobs_and_worker_row() -> None:
    job = jobs.sleep_then_mark.enqueue(2.0, "/dev/null")
    with running() as worker:
        wait_status(job, "running")
        first_beat = job.heartbeat_at
        row = WorkerRow.objects.get(id=worker.id)
        wait_until(
            lambda: Job.objects.get(id=job.id).heartbeat_at > first_beat,
            timeout=3,
            message="a heartbeat",
        )
        wait_until(
            lambda: WorkerRow.objects.get(id=worker.id).last_seen > row.last_seen,
            timeout=3,
            message="the worker row to refresh",
        )
        assert row.pid > 0 and row.queues == ["*"] and row.concurrency == DEFAULT_CONCURRENCY
        wait_status(job, "completed")
    assert not WorkerRow.objects.filter(id=worker.id).exists()


def test_lost_lease_is_noticed_by_heartbeat_and_fenced(caplog: pytest.LogCaptureFixture) -> None:
    fenced: list[dict[str, Any]] = []

    def on_fenced(**kwargs: Any) -> None:
        fenced.append(kwargs)

    signals.job_fenced.connect(on_fenced)
    try:
        job = jobs.wait_for_cancel.enqueue(10.0)
        with caplog.at_level(logging.WARNING, logger="django_pgjobs"), running() as worker:
            wait_status(job, "running")
            job_cancel(connection, [job.id])
            # The heartbeat sees the lease move, the job's context turns cancelled, it
            # returns early, and its completion is refused.
            wait_until(lambda: worker.counts["fenced"] == 1, timeout=10, message="fenced")
        writes = sorted(f["write"] for f in fenced if f["job_id"] == job.id)
        assert writes == ["complete", "heartbeat"]
        job.refresh_from_db()
        assert job.status == "cancelled" and not JobResult.objects.filter(job_id=job.id).exists()
        lost = [r for r in caplog.records if "lease 1 lost" in r.getMessage()]
        assert lost and all(r.levelno == logging.WARNING for r in lost)
        assert {(r.job_id, r.task, r.attempt, r.worker) for r in lost} == {  # type: ignore[attr-defined]
            (job.id, "tests.testapp.jobs.wait_for_cancel", 1, worker.id)
        }
    finally:
        signals.job_fenced.disconnect(on_fenced)


def test_using_timeout_none_lifts_the_limit_of_the_job() -> None:
    # @job(timeout=1): .using(timeout=None) runs without a limit, as docs/reference/api.md says.
    unlimited = core_jobs.sleeps_past_timeout.using(timeout=None, max_attempts=1).enqueue(1.6)
    limited = core_jobs.sleeps_past_timeout.using(max_attempts=1).enqueue(1.6)
    run_burst(concurrency=2)
    unlimited.refresh_from_db()
    limited.refresh_from_db()
    assert (unlimited.status, unlimited.result) == ("completed", "finished late")
    assert limited.status == "dead" and "JobTimeout" in (limited.last_error or "")


def test_max_jobs_stops_after_that_many_claims() -> None:
    made = [jobs.noop.enqueue() for _ in range(10)]
    worker = Worker(max_jobs=3, maintenance=False, batch=2)
    assert worker.run() == 0
    assert worker.claimed_count == 3 and worker.counts["completed"] == 3
    assert Job.objects.filter(id__in=[j.id for j in made], status="completed").count() == 3


def test_queues_filter() -> None:
    email = jobs.send_email.enqueue("a@b.c")
    other = jobs.add.enqueue(1, 1)
    run_burst(queues=["emails"])
    assert status_of(email) == "completed" and status_of(other) == "pending"


def test_logs_carry_job_id_task_attempt_and_worker(caplog: pytest.LogCaptureFixture) -> None:
    job = jobs.always_fails.using(max_attempts=1).enqueue("logged")
    with caplog.at_level(logging.INFO, logger="django_pgjobs"):
        worker = run_burst()
    [record] = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert record.levelno == logging.ERROR and "logged" in record.getMessage()
    assert (record.job_id, record.task, record.attempt, record.worker) == (  # type: ignore[attr-defined]
        job.id,
        "tests.testapp.jobs.always_fails",
        1,
        worker.id,
    )


def test_a_notify_wakes_an_idle_worker_fast() -> None:
    with running(poll_interval=30) as worker:
        wait_until(lambda: WorkerRow.objects.filter(id=worker.id).exists(), message="start")
        wait_until(_listening, message="the LISTEN connection")
        job = jobs.noop.enqueue()
        wait_status(job, "completed", timeout=2)


def _listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query = 'LISTEN pgjobs'"
        )
        return bool(cursor.fetchone()[0])


class _WaitsOnALock:
    """A maintenance pass that waits on a lock another session holds, as a pass would
    wait for a worker frozen inside its transaction."""

    name = "waits-on-a-lock"
    interval = 0.1

    def run_once(self) -> dict[str, Any]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(7426)")
        return {}


def test_a_pass_waiting_on_a_lock_does_not_hold_up_the_reaper(other_connection: Any) -> None:
    """The reaper runs in a thread of its own: a job whose worker went silent is
    reclaimed while another maintenance pass of the same worker waits on a lock."""
    from django_pgjobs.maintenance.reaper import Reaper

    other_connection.execute("SELECT pg_advisory_lock(7426)")
    try:
        with running(services=[_WaitsOnALock(), Reaper(stale_after=2.0)]):
            wait_until(
                lambda: other_connection.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                ).fetchone()[0],
                message="the pass waiting on the lock",
            )
            # the suite's helper: running, attempt 1, its heartbeat a minute old
            job = make_job(
                JobStatus.RUNNING, task="tests.testapp.jobs.noop", args=[], heartbeat_age=60.0
            )
            wait_status(job, "pending", "completed", timeout=30)
            other_connection.execute("SELECT pg_advisory_unlock(7426)")
    finally:
        other_connection.execute("SELECT pg_advisory_unlock_all()")
