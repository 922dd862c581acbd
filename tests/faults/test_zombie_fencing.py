"""Scenario 2: a zombie's every write is fenced.

Worker A claims the job (lease 1) and is frozen with SIGSTOP past STALE_AFTER.
Worker B reaps it (lease 2), claims it (lease 3) and completes it. Then A is
thawed and attempts one write about its lease-1 claim. That write must change
zero rows (the row is byte-for-byte B's outcome), be logged as a warning, and
fire ``job_fenced`` with the write's name.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import wait_until
from tests.faults.conftest import (
    Workers,
    effects,
    enqueue,
    go,
    wait_status,
    wait_stopped,
)

STEP = "tests.testapp.jobs.fault_step"
ATOMIC = "tests.testapp.jobs.fault_atomic"


def snapshot(db: psycopg.Connection, job: int) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT j.*, (SELECT array_agg(r.value::text) FROM "
        "django_pgjobs_jobresult r WHERE r.job_id = j.id) FROM django_pgjobs_job j "
        "WHERE j.id = %s",
        [job],
    ).fetchone()
    assert row is not None
    return tuple(row)


def freeze_a_and_let_b_finish(
    db: psycopg.Connection, workers: Workers, workdir: Path, job: int, a
) -> tuple[Any, ...]:
    wait_until(lambda: (workdir / f"waiting-{job}-1").exists(), message="A's handler waiting")
    os.killpg(a.pid, signal.SIGSTOP)
    wait_stopped(a.pid)
    go(workdir, job, 3)
    workers.start("--concurrency", "1")
    # B starts (Django), A goes stale, the reaper and B's isolated run (a child
    # process): over 30 s on a loaded CI box.
    row = wait_status(db, job, "completed", timeout=60)
    assert row["lease"] == 3
    return snapshot(db, job)


def wait_fenced(workers: Workers, job: int, write: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for record in workers.signals():
            if (
                record["signal"] == "job_fenced"
                and record["job_id"] == job
                and record["write"] == write
            ):
                return record
        return None

    return wait_until(found, timeout=20, message=f"job_fenced signal for the {write} write")


@pytest.mark.parametrize("write", ["heartbeat", "complete", "retry", "dead", "release"])
def test_zombie_write_changes_nothing(db, workers: Workers, workdir: Path, write: str) -> None:
    mode = {"retry": "raise", "dead": "discard"}.get(write, "ok")
    job = enqueue(db, STEP, kwargs={"dir": str(workdir), "wait_go": True, "mode": mode})
    a = workers.start("--concurrency", "1", PGJOBS_TEST_SHUTDOWN_TIMEOUT="1")
    before = freeze_a_and_let_b_finish(db, workers, workdir, job, a)

    if write in ("complete", "retry", "dead"):
        go(workdir, job, 1)  # A's handler returns / raises as soon as it is thawed
    os.killpg(a.pid, signal.SIGCONT)
    if write == "release":
        a.signal(signal.SIGTERM)  # shutdown: A releases its unfinished job
    record = wait_fenced(workers, job, write)

    assert record["lease"] == 1 and record["pid"] == a.pid
    assert snapshot(db, job) == before, f"the zombie's {write} changed the row"
    wait_until(
        lambda: "lease 1 lost" in a.output() or "lease 1" in a.output(),
        message="A logged the fenced write",
    )
    assert "WARNING" in a.output() or "lost" in a.output()
    go(workdir, job, 1)
    if write == "release":
        assert a.wait(timeout=20) == 0
    # A's handler ran on lease 1 and B's on lease 3; the row is B's.
    assert {e[0] for e in effects(db, job, "end")} <= {1, 3}


def test_zombie_atomic_job_rolls_back(db, workers: Workers, workdir: Path) -> None:
    job = enqueue(db, ATOMIC, kwargs={"dir": str(workdir), "wait_go": True})
    a = workers.start("--concurrency", "1")
    before = freeze_a_and_let_b_finish(db, workers, workdir, job, a)
    go(workdir, job, 1)
    os.killpg(a.pid, signal.SIGCONT)
    wait_fenced(workers, job, "complete")
    assert snapshot(db, job) == before
    # A's effect row was written in the transaction the lease re-check rolled back.
    assert [e[0] for e in effects(db, job)] == [3]
