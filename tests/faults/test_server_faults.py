"""Scenario 4: the server restarts mid-drain, and backends are killed under the workers.

Workers must reconnect by themselves with backoff and rate-limited logs,
re-LISTEN, and finish every job. The poll interval is 30 s, so a job enqueued
afterwards that runs within seconds proves the NOTIFY path came back.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import psycopg

from tests.conftest import wait_until
from tests.faults.conftest import (
    DBNAME,
    Workers,
    effects,
    enqueue,
    go,
    job_row,
    status_counts,
    wait_effect,
    wait_status,
)

COUNT = "tests.testapp.jobs.fault_count"
STEP = "tests.testapp.jobs.fault_step"
IDLE_POLL = "30"
DB_ERROR_LINE = re.compile(r"database error on the (\w+ connection|\w+)")


def listeners(db: psycopg.Connection) -> set[int]:
    return {
        r[0]
        for r in db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s"
            " AND query IN ('LISTEN pgjobs', 'SELECT 1') AND pid <> pg_backend_pid()",
            [DBNAME],
        ).fetchall()
    }


def assert_wakes_on_notify(db: psycopg.Connection, timeout: float = 6) -> None:
    """With a 30 s poll, only a delivered NOTIFY runs a new job this fast."""
    job = enqueue(db, COUNT)
    wait_status(db, job, "completed", timeout=timeout)


def db_error_lines(log: str) -> int:
    return len(DB_ERROR_LINE.findall(log))


def test_server_restart_mid_drain(db, workers: Workers, cluster) -> None:
    total = 1500
    db.execute(
        "INSERT INTO django_pgjobs_job (task, args, kwargs, max_attempts, queue)"
        " SELECT %s, '[]', '{}', 5, 'q' || (g %% 3) FROM generate_series(1, %s) g",
        [COUNT, total],
    )
    procs = [
        workers.start("--concurrency", "4", "--batch", "10", "--poll-interval", IDLE_POLL)
        for _ in range(2)
    ]
    # Both workers at work before the restart (each has run a job): at CI's load one
    # once opened its connections only after it, so it had nothing to recover.
    pids = {p.pid for p in procs}
    wait_until(
        lambda: (
            status_counts(db).get("completed", 0) >= 200
            and pids <= {r[0] for r in db.execute("SELECT DISTINCT pid FROM fault_effects")}
        ),
        timeout=60,
        message="drain under way on both workers",
    )
    restarted = time.monotonic()
    cluster.restart()
    db_after = psycopg.connect(cluster.dsn(DBNAME), autocommit=True)
    with db_after:
        wait_until(
            lambda: status_counts(db_after) == {"completed": total},
            timeout=90,
            message="every job completed after the restart",
        )
        elapsed = time.monotonic() - restarted
        for p in procs:
            assert p.proc.poll() is None, "a worker died with the server"
        # Every job ran; a second run only for jobs whose attempt was cut off (recorded).
        rows = db_after.execute(
            "SELECT j.id, j.attempts, count(e.id) FROM django_pgjobs_job j"
            " LEFT JOIN fault_effects e ON e.job_id = j.id GROUP BY j.id"
        ).fetchall()
        assert all(n >= 1 for _, _, n in rows)
        assert all(n <= attempts for _, attempts, n in rows), "a run with no attempt counted"
        wait_until(lambda: len(listeners(db_after)) >= 2, message="both workers re-LISTENed")
        assert_wakes_on_notify(db_after)
        for p in procs:
            log = p.output()
            assert "recovered" in log
            # Rate-limited: about one line per failing connection (or maintenance pass)
            # per 10 s, not one per retry.
            per_source = Counter(DB_ERROR_LINE.findall(log))
            assert max(per_source.values(), default=0) <= 1 + elapsed / 10, log[-3000:]


def test_killed_connections(db, workers: Workers, workdir: Path, cluster) -> None:
    w = workers.start("--concurrency", "2", "--poll-interval", IDLE_POLL)
    wait_until(lambda: len(listeners(db)) == 1, message="listener up")
    assert_wakes_on_notify(db)

    # (a) the LISTEN connection
    (old,) = listeners(db)
    db.execute("SELECT pg_terminate_backend(%s)", [old])
    wait_until(lambda: listeners(db) - {old}, message="a new LISTEN connection")
    assert_wakes_on_notify(db)

    # (b) the claiming connection, idle between claims
    claimers = [
        r[0]
        for r in db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query LIKE '%%started_at = now()%%'"
            " AND pid <> pg_backend_pid()",
            [DBNAME],
        ).fetchall()
    ]
    assert len(claimers) == 1
    db.execute("SELECT pg_terminate_backend(%s)", [claimers[0]])
    assert_wakes_on_notify(db)

    # (c) the completing connection, while its UPDATE waits on a row lock
    job = enqueue(db, STEP, kwargs={"dir": str(workdir), "wait_go": True})
    wait_effect(db, job, "start", lease=1)
    with psycopg.connect(cluster.dsn(DBNAME)) as locker:
        locker.execute("SELECT 1 FROM django_pgjobs_job WHERE id = %s FOR UPDATE", [job])
        go(workdir, job, 1)
        completer = wait_until(
            lambda: db.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%finished_at = now()%%'"
            ).fetchone(),
            message="the completion blocked on the row lock",
        )
        db.execute("SELECT pg_terminate_backend(%s)", [completer[0]])
        time.sleep(0.2)  # let the completer see its connection die before the lock goes
        locker.commit()
    row = wait_status(db, job, "completed")
    # The completion was retried on a new connection and landed once: no re-run.
    assert (row["attempts"], row["lease"], row["errors"]) == (1, 1, [])
    assert len(effects(db, job, "end")) == 1
    assert (
        db.execute(
            "SELECT count(*) FROM django_pgjobs_jobresult WHERE job_id = %s", [job]
        ).fetchone()[0]
        == 1
    )
    assert w.proc.poll() is None
    assert "recovered" in w.output()
    assert job_row(db, job)["finished_at"] is not None
