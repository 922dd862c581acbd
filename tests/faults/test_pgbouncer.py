"""Scenario 5: the core scenarios through pgbouncer in transaction mode, LISTEN off.

Debian's pgbouncer is started by the rig in front of the suite's cluster; the
workers connect to it with ``runjobs --no-listen``. The server logs every
statement of the suite's database meanwhile, and the log must show no session
state: no SET, no advisory locks, no named (server-side) prepared statements.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import wait_until
from tests.faults.conftest import (
    DBNAME,
    Workers,
    effects,
    enqueue,
    go,
    sigkill,
    status_counts,
    wait_effect,
    wait_status,
    wait_stopped,
)

STEP = "tests.testapp.jobs.fault_step"
COUNT = "tests.testapp.jobs.fault_count"
SESSION_STATE = re.compile(
    r"(statement|execute [^:]*): (SET |RESET |DISCARD |PREPARE |LISTEN |.*pg_advisory)",
    re.IGNORECASE,
)
NAMED_PREPARED = re.compile(r"execute (?!<unnamed>)[^:\s]+:")


@pytest.fixture
def logged(
    db: psycopg.Connection, cluster, bouncer, request: pytest.FixtureRequest
) -> Iterator[Callable[[], str]]:
    """Log every statement of the suite's database (on fresh server connections); on a
    failure, print the end of pgbouncer's log."""
    db.execute(f"ALTER DATABASE {DBNAME} SET log_statement = 'all'")
    # Behind a transaction pooler the server's time zone must be Django's, or Django
    # sends SET TIME ZONE on connect (documented in the pgbouncer how-to).
    db.execute(f"ALTER DATABASE {DBNAME} SET timezone = 'UTC'")
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid()",
        [DBNAME],
    )
    start = len(cluster.server_log())
    yield lambda: cluster.server_log()[start:]
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed and bouncer.log.exists():
        tail = bouncer.log.read_text(errors="replace")[-4000:]
        sys.stderr.write(f"\n----- pgbouncer log -----\n{tail}\n")
    db.execute(f"ALTER DATABASE {DBNAME} RESET log_statement")
    db.execute(f"ALTER DATABASE {DBNAME} RESET timezone")


def test_core_scenarios_through_pgbouncer(
    db, workers: Workers, workdir: Path, bouncer, logged
) -> None:
    url = bouncer.url(DBNAME)

    # Drain: every job exactly once.
    total = 300
    db.execute(
        "INSERT INTO django_pgjobs_job (task, args, kwargs, max_attempts)"
        " SELECT %s, '[]', '{}', 5 FROM generate_series(1, %s)",
        [COUNT, total],
    )
    drainers = [workers.start("--no-listen", "--concurrency", "4", url=url) for _ in range(2)]
    wait_until(
        lambda: status_counts(db) == {"completed": total},
        timeout=60,
        message="drain through pgbouncer",
    )
    per_job = db.execute(
        "SELECT count(*), min(n), max(n) FROM (SELECT job_id, count(*) n"
        " FROM fault_effects GROUP BY job_id) x"
    ).fetchone()
    assert per_job == (total, 1, 1)
    for d in drainers:
        sigkill(d)

    # Kill mid-job: the job is reclaimed and completed by another worker.
    job = enqueue(db, STEP, kwargs={"dir": str(workdir), "wait_go": True})
    go(workdir, job, 3)
    a = workers.start("--no-listen", "--concurrency", "1", url=url)
    wait_effect(db, job, "start", lease=1)
    b = workers.start("--no-listen", "--concurrency", "1", url=url)
    sigkill(a)
    row = wait_status(db, job, "completed", timeout=60)  # reaped, run isolated by b
    assert (row["attempts"], row["lease"]) == (1, 3)  # the lost worker's attempt given back
    sigkill(b)

    # Zombie: a frozen worker's completion is fenced.
    job = enqueue(db, STEP, kwargs={"dir": str(workdir), "wait_go": True})
    go(workdir, job, 3)
    z = workers.start("--no-listen", "--concurrency", "1", url=url)
    wait_effect(db, job, "start", lease=1)
    os.killpg(z.pid, signal.SIGSTOP)
    wait_stopped(z.pid)
    workers.start("--no-listen", "--concurrency", "1", url=url)
    before = wait_status(db, job, "completed", timeout=60, lease=3)
    go(workdir, job, 1)
    os.killpg(z.pid, signal.SIGCONT)
    wait_until(
        lambda: any(
            r["signal"] == "job_fenced" and r["job_id"] == job and r["write"] == "complete"
            for r in workers.signals()
        ),
        message="the zombie's completion fenced",
    )
    assert wait_status(db, job, "completed") == before
    assert {e[0] for e in effects(db, job, "end")} == {1, 3}

    time.sleep(0.5)  # let the server flush its log
    log = logged()
    assert "statement:" in log or "execute" in log, "statement logging is not on"
    assert not SESSION_STATE.findall(log), SESSION_STATE.findall(log)[:5]
    assert not NAMED_PREPARED.findall(log), NAMED_PREPARED.findall(log)[:5]
    for w in workers.started:
        assert "prepared statement" not in w.output()
