"""Scenarios 8 and 9: a long job stays owned; graceful shutdown and a second signal."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.conftest import wait_until
from tests.faults.conftest import (
    Workers,
    effects,
    enqueue,
    go,
    job_row,
    wait_effect,
    wait_status,
)

STEP = "tests.testapp.jobs.fault_step"
COUNT = "tests.testapp.jobs.fault_count"

# Scenario 8 runs with a shorter lease so that 10 x STALE_AFTER stays short.
LONG_STALE, LONG_HEARTBEAT = 1.2, 0.3


def test_long_jobs_with_heartbeats_are_never_reclaimed(db, workers: Workers) -> None:
    run_for = 10 * LONG_STALE
    sleeper = enqueue(db, STEP, kwargs={"hold": run_for})
    spinner = enqueue(db, STEP, kwargs={"hold": run_for, "spin": True})  # CPU-bound pure Python
    env = {"PGJOBS_TEST_STALE_AFTER": str(LONG_STALE), "PGJOBS_TEST_HEARTBEAT": str(LONG_HEARTBEAT)}
    # Two workers, both running the reaper with the short STALE_AFTER.
    a = workers.start("--concurrency", "2", **env)
    b = workers.start("--concurrency", "2", **env)
    for job in (sleeper, spinner):
        row = wait_status(db, job, "completed", timeout=run_for + 20)
        assert (row["attempts"], row["lease"], row["errors"]) == (1, 1, [])
        assert [e[3] for e in effects(db, job)] == ["start", "end"]
    assert "reaped" not in a.output() + b.output()


def test_graceful_shutdown_finishes_short_jobs_and_releases_long_ones(
    db, workers: Workers, workdir: Path
) -> None:
    # The short jobs run until the signal has been sent (a file the test creates), so
    # no slot frees before it: with a fixed hold, a loaded box (CI) reached the signal
    # after a short job had ended and a later job had been claimed into its slot.
    finish = workdir / "short-jobs-finish"
    short_kwargs = {"hold": 60.0, "until_file": str(finish)}
    short = [enqueue(db, STEP, kwargs=short_kwargs, priority=10) for _ in range(3)]
    long = enqueue(db, STEP, kwargs={"dir": str(workdir), "wait_go": True}, priority=10)
    later = [enqueue(db, COUNT) for _ in range(3)]  # lower priority: not in the first claim
    w = workers.start("--concurrency", "4", PGJOBS_TEST_SHUTDOWN_TIMEOUT="2")
    for job in [*short, long]:
        wait_effect(db, job, "start")
    w.signal(signal.SIGTERM)
    sent = time.monotonic()
    wait_until(lambda: "got SIGTERM" in w.output(), timeout=5, message="the signal handled")
    finish.touch()
    assert w.wait(timeout=15) == 0
    assert time.monotonic() - sent < 2 + 3  # SHUTDOWN_TIMEOUT plus slack
    for job in short:
        assert job_row(db, job)["status"] == "completed"
    row = job_row(db, long)
    # Released: back to pending at once, attempt not counted, no error recorded.
    assert (row["status"], row["attempts"], row["errors"]) == ("pending", 0, [])
    for job in later:  # nothing new was claimed once the signal arrived
        assert (job_row(db, job)["status"], job_row(db, job)["lease"]) == ("pending", 0)
    assert db.execute("SELECT count(*) FROM django_pgjobs_worker").fetchone()[0] == 0
    assert "released job" in w.output()


def test_second_signal_exits_at_once_and_the_job_is_reclaimed(
    db, workers: Workers, workdir: Path
) -> None:
    job = enqueue(db, STEP, kwargs={"dir": str(workdir), "wait_go": True})
    go(workdir, job, 3)  # the rescuer's run may finish
    a = workers.start("--concurrency", "1", PGJOBS_TEST_SHUTDOWN_TIMEOUT="30")
    wait_effect(db, job, "start", lease=1)
    a.signal(signal.SIGTERM)
    wait_until(lambda: "got SIGTERM" in a.output(), message="first signal handled")
    a.signal(signal.SIGTERM)
    sent = time.monotonic()
    assert a.wait(timeout=10) != 0
    assert time.monotonic() - sent < 2
    assert job_row(db, job)["status"] == "running"  # left for the reaper
    workers.start("--concurrency", "1")
    row = wait_status(db, job, "completed", timeout=20)
    assert (row["attempts"], row["lease"]) == (1, 3)  # the lost worker's attempt given back
    assert [e["type"] for e in row["errors"]] == ["django_pgjobs.exceptions.WorkerLost"]
