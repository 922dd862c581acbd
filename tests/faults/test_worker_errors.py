"""The worker's error paths and per-job timeouts, with real runjobs.

Each scenario puts a hostile row, value or exception in front of a real worker
process and checks that the job it concerns fails alone with a clear error,
the rest of the batch runs, and the worker neither dies nor wedges nor hangs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import wait_until
from tests.faults.conftest import Workers, enqueue, job_row, status_counts, wait_status

HOSTILE = "tests.testapp.core_jobs.hostile"
ADD = "tests.testapp.jobs.add"
NOOP = "tests.testapp.jobs.noop"


def _burst(workers: Workers, *args: str, timeout: float = 60) -> str:
    w = workers.start("--burst", "--no-maintenance", *args)
    rc = w.wait(timeout=timeout)
    out = w.output()
    assert rc == 0, out[-3000:]
    return out


# ----------------------------------------------------------------------------- item 1


def test_idempotency_read_failing_on_the_last_attempt_dead_letters_and_never_wedges(
    db: psycopg.Connection, workers: Workers
) -> None:
    """The stored-result read fails (the results table is gone for a moment): the
    attempt fails like any other; on the last attempt the job is dead, not pending
    with attempts = max_attempts, and the queue keeps moving."""
    keyed = db.execute(
        "INSERT INTO django_pgjobs_job (task, args, max_attempts, idempotency_key)"
        " VALUES (%s, '[1, 2]', 1, 'k-last') RETURNING id",
        [ADD],
    ).fetchone()[0]
    db.execute("ALTER TABLE django_pgjobs_jobresult RENAME TO core_hidden_results")
    try:
        w = workers.start("--concurrency", "2", "--no-maintenance")
        row = wait_status(db, keyed, "dead", timeout=30)
    finally:
        db.execute("ALTER TABLE core_hidden_results RENAME TO django_pgjobs_jobresult")
    assert row["attempts"] == 1
    assert "core_hidden_results" not in row["errors"][0]["message"]
    assert "jobresult" in row["errors"][0]["message"]
    fresh = enqueue(db, ADD, args=[2, 3])
    wait_status(db, fresh, "completed", timeout=30)
    assert w.proc.poll() is None


def test_a_row_pending_with_its_attempts_used_up_is_isolated_not_wedging_the_queue(
    db: psycopg.Connection, workers: Workers
) -> None:
    """Such a row makes every claim statement violate attempts_in_bounds: the worker
    dead-letters it (logged with its id) and the innocent jobs of its queue run."""
    bad = db.execute(
        "INSERT INTO django_pgjobs_job (task, args, attempts, max_attempts)"
        " VALUES (%s, '[1, 1]', 3, 3) RETURNING id",
        [ADD],
    ).fetchone()[0]
    good = [enqueue(db, ADD, args=[i, i]) for i in range(5)]
    out = _burst(workers, "--concurrency", "4")
    for job_id in good:
        assert job_row(db, job_id)["status"] == "completed"
    row = job_row(db, bad)
    assert row["status"] == "dead" and row["attempts"] == 3
    assert "attempts used up" in row["last_error"]
    assert f"job {bad} " in out


# ----------------------------------------------------------------------------- item 6


@pytest.fixture
def small_results(db: psycopg.Connection) -> Iterator[None]:
    """A CHECK constraint on results that one job's return value violates."""
    db.execute(
        "ALTER TABLE django_pgjobs_jobresult ADD CONSTRAINT core_small_result"
        " CHECK (value IS NULL OR length(value::text) < 100)"
    )
    try:
        yield
    finally:
        db.execute("ALTER TABLE django_pgjobs_jobresult DROP CONSTRAINT core_small_result")


def test_a_data_error_in_a_batched_completion_fails_only_its_row(
    db: psycopg.Connection, workers: Workers, small_results: None
) -> None:
    good = [enqueue(db, ADD, args=[i, 1]) for i in range(8)]
    big = enqueue(db, HOSTILE, args=["big"])
    out = _burst(workers, "--concurrency", "8")
    for job_id in good:
        assert job_row(db, job_id)["status"] == "completed", out[-2000:]
    row = job_row(db, big)
    assert row["status"] == "dead"
    assert "core_small_result" in row["last_error"]
    assert "could not be written" in row["last_error"]
    assert "one by one" in out


# ----------------------------------------------------------------------------- item 7


@pytest.mark.parametrize(
    "kind, text",
    [
        ("deep", "deep"),  # "nested too deeply" / "nests ... levels deep"
        ("exiting_str", "unprintable"),
        ("huge_int", "digits"),  # "cannot be stored as JSON: ... digits" / "an int of ... digits"
    ],
)
def test_hostile_values_and_exceptions_fail_their_job_and_the_worker_lives(
    db: psycopg.Connection, workers: Workers, kind: str, text: str
) -> None:
    # One attempt: --burst leaves a retry scheduled in the future for later.
    hostile = enqueue(db, HOSTILE, args=[kind], max_attempts=1)
    after = [enqueue(db, ADD, args=[i, 2]) for i in range(4)]
    out = _burst(workers, "--concurrency", "2", timeout=90)
    row = job_row(db, hostile)
    assert row["status"] == "dead", out[-2000:]
    assert row["attempts"] <= row["max_attempts"]
    assert all(text in e["message"] for e in row["errors"]), row["errors"]
    for job_id in after:
        assert job_row(db, job_id)["status"] == "completed"
    assert status_counts(db).get("running", 0) == 0


# ----------------------------------------------------------------------------- item 8


def test_undecodable_stored_arguments_fail_their_row_and_the_batch_runs(
    db: psycopg.Connection, workers: Workers
) -> None:
    # Written by hand (psql, an older release): pgjobs_enqueue refuses both since 0003.
    insert = (
        "INSERT INTO django_pgjobs_job (task, args, run_at) VALUES (%s, %s::jsonb, now())"
        " RETURNING id"
    )
    huge = db.execute(insert, [ADD, "[1e5000]"]).fetchone()[0]
    deep_json = "[" * 2000 + "]" * 2000
    deep = db.execute(insert, [ADD, deep_json]).fetchone()[0]
    good = [enqueue(db, ADD, args=[i, 3]) for i in range(6)]
    _burst(workers, "--concurrency", "4", "--batch", "20")
    for bad in (huge, deep):
        # (not job_row: it would decode the hostile args in this process)
        status, attempts, last_error = db.execute(
            "SELECT status, attempts, last_error FROM django_pgjobs_job WHERE id = %s", [bad]
        ).fetchone()
        assert status == "dead" and attempts == 1
        assert "cannot be decoded" in last_error
    for job_id in good:
        assert job_row(db, job_id)["status"] == "completed"


# ----------------------------------------------------------------------------- timeouts


def test_a_job_past_its_timeout_is_dead_lettered_with_jobtimeout_and_the_worker_serves_others(
    db: psycopg.Connection, workers: Workers
) -> None:
    slow = enqueue(db, "tests.testapp.core_jobs.sleeps_past_timeout", args=[5.0], max_attempts=2)
    w = workers.start("--concurrency", "2", "--no-maintenance")
    wait_until(
        lambda: job_row(db, slow)["status"] == "running",
        timeout=20,
        message="the slow job to start",
    )
    # While the slow job runs (and after it is abandoned), other work flows.
    others = [enqueue(db, ADD, args=[i, 4]) for i in range(10)]
    for job_id in others:
        wait_status(db, job_id, "completed", timeout=20)
    row = wait_status(db, slow, "dead", timeout=30)
    assert row["attempts"] == 2
    assert [e["type"] for e in row["errors"]] == ["django_pgjobs.exceptions.JobTimeout"] * 2
    assert "timeout of 1s" in row["errors"][0]["message"]
    assert row["lease"] >= 3  # two claims and at least one bump on giving up
    more = enqueue(db, ADD, args=[40, 2])
    wait_status(db, more, "completed", timeout=20)
    # The abandoned runs return later; nothing they do changes the row.
    wait_until(
        lambda: "returned after" in w.output(), timeout=20, message="the abandoned run to return"
    )
    assert job_row(db, slow)["status"] == "dead"
    assert w.proc.poll() is None


def test_a_sync_job_sees_is_cancelled_after_its_timeout(
    db: psycopg.Connection, workers: Workers
) -> None:
    job_id = db.execute(
        "INSERT INTO django_pgjobs_job (task, kwargs, max_attempts, timeout)"
        " VALUES ('tests.testapp.core_jobs.watches_cancel', '{\"seconds\": 10}', 1, 0.5)"
        " RETURNING id"
    ).fetchone()[0]
    w = workers.start("--concurrency", "1", "--no-maintenance", "-v", "2")
    row = wait_status(db, job_id, "dead", timeout=20)
    assert "JobTimeout" in row["last_error"]
    # The run noticed the cancel and returned well before its 10 s.
    wait_until(
        lambda: "returned after" in w.output(),
        timeout=5,
        message="the run to notice is_cancelled()",
    )


def test_an_async_job_past_its_timeout_is_cancelled(
    db: psycopg.Connection, workers: Workers
) -> None:
    job_id = enqueue(db, "tests.testapp.core_jobs.async_past_timeout", max_attempts=1)
    after = enqueue(db, "tests.testapp.core_jobs.async_sleep", args=[0.01])
    _burst(workers, timeout=30)
    row = job_row(db, job_id)
    assert row["status"] == "dead" and "JobTimeout" in row["last_error"]
    assert job_row(db, after)["status"] == "completed"


def test_a_worker_with_too_many_abandoned_threads_restarts_and_says_why(
    db: psycopg.Connection, workers: Workers
) -> None:
    slow = [
        db.execute(
            "INSERT INTO django_pgjobs_job (task, args, max_attempts, timeout)"
            " VALUES ('tests.testapp.core_jobs.sleeps_past_timeout', '[20]', 1, 0.3)"
            " RETURNING id"
        ).fetchone()[0]
        for _ in range(3)
    ]
    w = workers.start("--concurrency", "1", "--no-maintenance")
    for job_id in slow:
        wait_status(db, job_id, "dead", timeout=30)
    wait_until(
        lambda: "restarting" in w.output(), timeout=30, message="the worker to restart itself"
    )
    assert "abandoned by timed-out jobs" in w.output()
    # Same process (exec), fresh threads: it serves work again.
    after = enqueue(db, ADD, args=[1, 1])
    wait_status(db, after, "completed", timeout=30)
    assert w.proc.poll() is None
    assert json.dumps(job_row(db, slow[0])["errors"])
