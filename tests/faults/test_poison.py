"""Scenario 6: poison jobs, and signal receivers that raise.

One worker (concurrency 1) meets every kind of bad job in a row. Each must reach
its documented state with the error recorded, and the job queued after them
must still run. The same run with a receiver that raises on every signal must
end in exactly the same rows.
"""

from __future__ import annotations

import json

import pytest

from tests.faults.conftest import Workers, enqueue, job_row, wait_status

POISON = "tests.testapp.jobs.fault_poison"

#: kind -> (final status, attempts, exception type recorded, text in the message)
EXPECTED = {
    "raise": ("dead", 2, "builtins.ValueError", "poison raised"),
    "exit": ("dead", 2, "builtins.SystemExit", "3"),
    "kbint": ("dead", 2, "builtins.KeyboardInterrupt", ""),
    "set": ("dead", 1, "django_pgjobs.worker.executor._BadReturn", "return value"),
    "nan": ("dead", 1, "django_pgjobs.worker.executor._BadReturn", "return value"),
    "nul_error": ("dead", 2, "builtins.ValueError", "bad \\x00 byte"),
    "unprintable": ("dead", 2, "tests.testapp.jobs.FaultUnprintable", "unprintable"),
    "nul_return": ("dead", 1, "django_pgjobs.worker.executor._BadReturn", "return value"),
    "surrogate_return": ("dead", 1, "django_pgjobs.worker.executor._BadReturn", "return value"),
    "surrogate_type": (
        "dead",
        2,
        "tests.testapp.jobs.FaultSurrogate\\ud800",
        "named \\udc00 badly",
    ),
}


@pytest.mark.parametrize("raising_receivers", [False, True], ids=["plain", "raising-receivers"])
def test_poison_jobs_reach_their_state_and_the_next_job_runs(
    db, workers: Workers, raising_receivers: bool
) -> None:
    ids = {kind: enqueue(db, POISON, args=[kind], max_attempts=2) for kind in EXPECTED}
    unknown = enqueue(db, "tests.testapp.jobs.no_such_job", max_attempts=3)
    bad_args = db.execute(
        "INSERT INTO django_pgjobs_job (task, args, kwargs, max_attempts)"
        " VALUES ('tests.testapp.jobs.add', '\"not a list\"', '[1]', 3) RETURNING id"
    ).fetchone()[0]
    last = enqueue(db, "tests.testapp.jobs.fault_count")
    env = {"PGJOBS_FAULT_RAISING_RECEIVERS": "1"} if raising_receivers else {}
    w = workers.start("--concurrency", "1", **env)

    wait_status(db, last, "completed", timeout=30)
    for kind, (status, attempts, exc_type, text) in EXPECTED.items():
        row = wait_status(db, ids[kind], status, timeout=15)
        assert row["attempts"] == attempts, kind
        assert [e["type"] for e in row["errors"]] == [exc_type] * attempts, kind
        assert all(text in e["message"] for e in row["errors"]), (kind, row["errors"])
        assert row["last_error"] and row["finished_at"] is not None, kind
        json.dumps(row["errors"])  # the recorded errors are plain JSON
    # Deploy skew (docs/howto/upgrade.md): the worker never claims a task it does not know; the job
    # waits for a worker that does (dead-lettered only after UNKNOWN_TASK_TIMEOUT).
    row = job_row(db, unknown)
    assert row["status"] == "pending" and row["attempts"] == 0 and row["errors"] == []
    row = wait_status(db, bad_args, "dead")
    assert row["attempts"] == 1 and "JSON array" in row["errors"][0]["message"]
    assert job_row(db, last)["errors"] == []
    assert w.proc.poll() is None, "the worker died"
    if raising_receivers:
        assert "a receiver that raises" in w.output()
