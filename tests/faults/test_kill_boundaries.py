"""Scenario 1: SIGKILL a worker at every boundary of a job's life.

Worker A claims the job and is killed at the boundary; worker B (already
running) reaps it after STALE_AFTER and runs it again. Afterwards, from the
database: the job is completed, attempts = 2, one "worker lost" error, lease
bumped by the reaper and by B's claim, and the handler's effects match the
at-least-once rule (a re-run only where A may have run the handler).
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from tests.conftest import wait_until
from tests.faults.conftest import (
    REAPER_INTERVAL,
    STALE_AFTER,
    Workers,
    effects,
    enqueue,
    go,
    job_row,
    sigkill,
    wait_effect,
    wait_status,
    wait_stopped,
)

STEP = "tests.testapp.jobs.fault_step"
ATOMIC = "tests.testapp.jobs.fault_atomic"
WORKER_LOST = "django_pgjobs.exceptions.WorkerLost"
#: The longest a dead worker's job may stay running: stale + one reaper pass + slack.
RECLAIM_BOUND = STALE_AFTER + REAPER_INTERVAL * 1.1 + 1.5


def start_b(workers: Workers, db: psycopg.Connection) -> None:
    """Start the rescuing worker and wait until it is up (its Worker row exists)."""
    before = db.execute("SELECT count(*) FROM django_pgjobs_worker").fetchone()[0]
    workers.start("--concurrency", "2")
    wait_until(
        lambda: db.execute("SELECT count(*) FROM django_pgjobs_worker").fetchone()[0] > before,
        message="worker B registered",
    )


def kill_and_time_reclaim(workers: Workers, db: psycopg.Connection, a, job: int) -> float:
    sigkill(a)
    killed = time.monotonic()
    wait_until(lambda: job_row(db, job)["lease"] >= 2, timeout=RECLAIM_BOUND + 5, message="reclaim")
    return time.monotonic() - killed


def assert_rescued(db: psycopg.Connection, job: int, elapsed: float) -> dict:
    row = wait_status(db, job, "completed")
    assert elapsed <= RECLAIM_BOUND, f"job stayed running {elapsed:.1f}s after the kill"
    assert row["attempts"] == 1  # a lost worker's attempt is given back
    assert row["lease"] == 3  # A's claim, the reaper's bump, B's claim
    assert [e["type"] for e in row["errors"]] == [WORKER_LOST]
    assert row["errors"][0]["refunded"] is True
    assert row["finished_at"] is not None
    assert (
        db.execute("SELECT count(*) FROM django_pgjobs_job WHERE status = 'running'").fetchone()[0]
        == 0
    )
    result = db.execute(
        "SELECT count(*) FROM django_pgjobs_jobresult WHERE job_id = %s", [job]
    ).fetchone()[0]
    assert result == 1
    return row


def test_kill_right_after_claim_commits(db, workers, workdir: Path) -> None:
    job = enqueue(db, STEP, kwargs={"stop_at": "claimed"})
    a = workers.start("--concurrency", "1")
    wait_status(db, job, "running")
    wait_stopped(a.pid)  # the handler stopped the process before doing anything
    start_b(workers, db)
    elapsed = kill_and_time_reclaim(workers, db, a, job)
    assert_rescued(db, job, elapsed)
    # A never got past the claim: the handler ran once, on B.
    assert [(e[0], e[3]) for e in effects(db, job)] == [(3, "start"), (3, "end")]


def test_kill_during_handler(db, workers, workdir: Path) -> None:
    job = enqueue(db, STEP, kwargs={"dir": str(workdir), "wait_go": True})
    go(workdir, job, 3)  # B's run (lease 3) may proceed; A's (lease 1) blocks
    a = workers.start("--concurrency", "1")
    wait_effect(db, job, "start", lease=1)
    start_b(workers, db)
    elapsed = kill_and_time_reclaim(workers, db, a, job)
    assert_rescued(db, job, elapsed)
    assert [(e[0], e[3]) for e in effects(db, job)] == [(1, "start"), (3, "start"), (3, "end")]


def test_kill_after_handler_before_completion_flush(db, workers, workdir: Path) -> None:
    job = enqueue(db, STEP, kwargs={"stop_at": "end"})
    a = workers.start("--concurrency", "1")
    wait_effect(db, job, "end", lease=1)
    wait_stopped(a.pid)  # the handler finished its work; its completion was never written
    assert job_row(db, job)["status"] == "running"
    start_b(workers, db)
    elapsed = kill_and_time_reclaim(workers, db, a, job)
    assert_rescued(db, job, elapsed)
    # The documented at-least-once duplicate: the handler's effects happened twice.
    assert [e[0] for e in effects(db, job, "end")] == [1, 3]


def test_kill_atomic_job_before_commit_applies_its_writes_once(db, workers, workdir) -> None:
    job = enqueue(db, ATOMIC, kwargs={"stop_at": "end"})
    a = workers.start("--concurrency", "1")
    wait_stopped(a.pid)  # inside the job's transaction, its effect row written, not committed
    assert job_row(db, job)["status"] == "running"
    start_b(workers, db)
    elapsed = kill_and_time_reclaim(workers, db, a, job)
    assert_rescued(db, job, elapsed)
    # A's transaction died with it: exactly one application, B's.
    assert [e[0] for e in effects(db, job)] == [3]


def test_kill_during_heartbeat(db, workers, workdir: Path, cluster) -> None:
    job = enqueue(db, STEP, kwargs={"dir": str(workdir), "wait_go": True})
    go(workdir, job, 3)
    a = workers.start("--concurrency", "1")
    wait_effect(db, job, "start", lease=1)
    start_b(workers, db)
    with psycopg.connect(cluster.dsn("faults")) as locker:
        # Hold the row so A's next heartbeat UPDATE blocks mid-statement, then kill A there.
        locker.execute("SELECT 1 FROM django_pgjobs_job WHERE id = %s FOR UPDATE", [job])
        wait_until(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                    " AND query LIKE '%%heartbeat_at = now()%%'"
                ).fetchone()[0]
                == 1
            ),
            message="A's heartbeat blocked on the row lock",
        )
        sigkill(a)
        killed = time.monotonic()
        locker.commit()
    wait_until(lambda: job_row(db, job)["lease"] >= 2, timeout=RECLAIM_BOUND + 5)
    assert_rescued(db, job, time.monotonic() - killed)
    assert [(e[0], e[3]) for e in effects(db, job)] == [(1, "start"), (3, "start"), (3, "end")]
