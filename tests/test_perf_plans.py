"""Performance invariants that can be asserted without timing anything.

* The claim stays on the partial claim index however much history the table holds
  (checked with EXPLAIN on 200,000 finished rows after ANALYZE; bench/run measures
  the drain rate with 1,000,000).
* A claim and a batched completion are one statement each, whatever the batch size,
  and take no SAVEPOINT.
* A claim finds the rows it picked through the primary key even before the
  statistics know about a bulk enqueue (generic plan).
* Writes about claimed jobs (completion, heartbeat, retry, dead letter, release,
  cancel) find their rows through the primary key even when the statistics say there
  are no running or completed rows (custom and generic plans).
* No foreign key touches the jobs table, so writing a result takes no row lock on it.
* The job threads (``JobRunners``) run every item and shut down cleanly.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from psycopg import sql as psycopg_sql

from django_pgjobs import sql
from django_pgjobs.worker.runners import JobRunners

HISTORY = 200_000


def _fill(
    history: int,
    pending: int,
    queues: tuple[str, ...] = ("default", "emails"),
    *,
    analyze: bool = True,
) -> None:
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {sql.JOB} (task, queue, status, run_at, created_at, started_at,"
            " finished_at, attempts, lease)"
            " SELECT 'history', (%(q)s::text[])[1 + g %% cardinality(%(q)s::text[])],"
            " 'completed', t, t, t, t, 1, 1"
            " FROM (SELECT g, now() - make_interval(secs => g) AS t"
            "       FROM generate_series(1, %(n)s) g) s",
            {"q": list(queues), "n": history},
        )
        cur.execute(
            f"INSERT INTO {sql.JOB} (task, queue, priority, run_at)"
            " SELECT 'live', (%(q)s::text[])[1 + g %% cardinality(%(q)s::text[])], g %% 3,"
            # The column default is statement_timestamp(), later than the claim's now()
            # inside this test's transaction.
            " now() - interval '1 second'"
            " FROM generate_series(1, %(n)s) g",
            {"q": list(queues), "n": pending},
        )
        if analyze:
            cur.execute(f"ANALYZE {sql.JOB}")


def _plan(statement: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        value = cur.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("statement", "extra"),
    [
        (sql.JOB_CLAIM_ONE_QUEUE, {"queue": "default"}),
        (sql.JOB_CLAIM_QUEUES, {"queues": ["default", "emails"]}),
        (sql.JOB_CLAIM_ALL, {}),
    ],
    ids=["one-queue", "queues", "all"],
)
def test_claim_uses_the_partial_index_with_a_large_history(statement: str, extra: dict) -> None:
    _fill(HISTORY, 1000)
    plan = _plan(statement, {"worker": "w", "n": 100, **extra})
    assert "pgjobs_job_claim_idx" in plan, plan
    # No scan of the table itself: history never enters the claim.
    assert '"Node Type": "Seq Scan"' not in plan, plan
    assert "Bitmap Heap Scan" not in plan, plan


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("JOB_CLAIM_ONE_QUEUE", {"queue": "default"}),
        ("JOB_CLAIM_QUEUES", {"queues": ["default", "emails"]}),
        ("JOB_CLAIM_ALL", {}),
    ],
    ids=["one-queue", "queues", "all"],
)
def test_claim_finds_its_rows_by_primary_key_before_the_statistics_catch_up(
    name: str, extra: dict
) -> None:
    """A table analysed while empty, then filled by a bulk enqueue (autovacuum has
    not analysed it again yet): joined as ``FROM picked WHERE j.id = picked.id``,
    the claim's generic plan hashed a sequential scan of the whole table, 13 ms per
    claim on 50,000 rows. Now a primary-key probe per id (``sql._CLAIM_SET``, shared
    by the three: with the old join this fixture flips the every-queue claim)."""
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {sql.JOB}")
    _fill(0, 30_000, analyze=False)
    plan = _generic_plan(getattr(sql, name), {"worker": "w", "n": 100, **extra})
    assert '"Node Type": "Seq Scan"' not in plan, plan
    assert "Hash Join" not in plan, plan
    assert "django_pgjobs_job_pkey" in plan, plan


@pytest.mark.django_db
def test_claim_and_complete_are_one_statement_each_without_savepoints() -> None:
    _fill(0, 200, queues=("default",))
    with CaptureQueriesContext(connection) as claimed_q:
        claimed = sql.claim(connection, worker="w", queues=["default"], n=150)
    assert len(claimed) == 150
    with CaptureQueriesContext(connection) as done_q:
        done = sql.complete_many(connection, [(c.id, c.lease, {"i": c.id}) for c in claimed])
    assert done == {c.id for c in claimed}
    queries = [q["sql"] for q in (*claimed_q.captured_queries, *done_q.captured_queries)]
    assert len(claimed_q.captured_queries) == 1, queries
    assert len(done_q.captured_queries) == 1, queries
    assert not any("SAVEPOINT" in q.upper() for q in queries), queries


@pytest.mark.django_db
def test_no_foreign_key_touches_the_jobs_table() -> None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' AND ("
            f" conrelid = '{sql.JOB}'::regclass OR confrelid = '{sql.JOB}'::regclass"
            f" OR conrelid = '{sql.RESULT}'::regclass)"
        )
        assert cur.fetchall() == []


def test_job_runners_run_every_item_then_stop() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def target(item: int) -> None:
        with lock:
            seen.append(item)

    runners: JobRunners[int] = JobRunners(4, target, "test-runner")
    for i in range(1000):
        runners.submit(i)
    runners.shutdown(wait=True)
    assert sorted(seen) == list(range(1000))
    assert not any(t.name.startswith("test-runner") and t.is_alive() for t in threading.enumerate())


def test_job_runners_cancel_pending_drops_queued_items() -> None:
    gate = threading.Event()
    ran: list[int] = []

    def target(item: int) -> None:
        gate.wait(5)
        ran.append(item)

    runners: JobRunners[int] = JobRunners(1, target, "test-cancel")
    for i in range(10):
        runners.submit(i)
    runners.shutdown(wait=False, cancel_pending=True)
    gate.set()
    for thread in [t for t in threading.enumerate() if t.name.startswith("test-cancel")]:
        thread.join(5)
    # At most the item the single thread had already taken ran.
    assert len(ran) <= 1


# --- writes about claimed jobs go through the primary key, whatever the statistics say


def _stale_statistics() -> list[tuple[int, int]]:
    """ANALYZE while every row is pending, then move rows to running and completed:
    the planner now believes there are no running or completed rows (what it believes
    after autovacuum analysed an idle queue, or the table right after a bulk enqueue).
    Returns (id, lease) of 64 running rows."""
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {sql.JOB} (task, queue, run_at)"
            " SELECT 'live', 'default', now() - interval '1 second'"
            " FROM generate_series(1, 20000)"
        )
        cur.execute(f"ANALYZE {sql.JOB}")
        cur.execute(
            f"UPDATE {sql.JOB} SET status = 'completed', attempts = 1, started_at = now(),"
            " finished_at = now() WHERE id IN (SELECT id FROM django_pgjobs_job ORDER BY id"
            " LIMIT 10000)"
        )
        cur.execute(
            f"UPDATE {sql.JOB} SET status = 'running', attempts = 1, lease = 1,"
            " started_at = now(), heartbeat_at = now(), worker = 'w'"
            " WHERE id IN (SELECT id FROM django_pgjobs_job WHERE status = 'pending'"
            " ORDER BY id LIMIT 64) RETURNING id, lease"
        )
        return sorted(cur.fetchall())


def _by_id_params(rows: list[tuple[int, int]]) -> dict[str, Any]:
    ids = [r[0] for r in rows]
    error = {"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "worker": "w", "type": "E"}
    return {
        "ids": ids,
        "leases": [r[1] for r in rows],
        "values": [None] * len(ids),
        "id": ids[0],
        "lease": rows[0][1],
        "delay": 1.0,
        "keep": 10,
        "retry": True,
        **sql._error_params(error),
    }


def _generic_plan(statement: str, params: dict[str, Any]) -> str:
    """The plan a prepared statement gets after its fifth run (PREPARE setting)."""
    with connection.cursor() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        numbered, names = _numbered(statement)
        # EXECUTE is a utility statement: its arguments cannot be bound server-side
        # (Django's server_side_binding), so they are rendered as literals here.
        raw = connection.connection
        arguments = psycopg_sql.SQL(", ").join(psycopg_sql.Literal(params[n]) for n in names)
        cur.execute(f"PREPARE generic_plan AS {numbered}")
        try:
            cur.execute(
                "EXPLAIN (FORMAT JSON) EXECUTE generic_plan ("
                + arguments.as_string(raw).replace("%", "%%")
                + ")"
            )
            value = cur.fetchone()[0]
        finally:
            cur.execute("DEALLOCATE generic_plan")  # prepared statements outlive a rollback
    return value if isinstance(value, str) else json.dumps(value)


def _numbered(statement: str) -> tuple[str, list[str]]:
    """``%(name)s`` placeholders as ``$1, $2 ...`` for PREPARE, and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, statement), names


BY_ID = ["JOB_COMPLETE_MANY", "JOB_COMPLETE_MANY_REDO", "JOB_HEARTBEAT", "JOB_RETRY", "JOB_TIMED_OUT", "JOB_DEAD",
         "JOB_RELEASE", "JOB_CANCEL"]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("name", BY_ID)
def test_writes_by_id_use_the_primary_key_even_with_stale_statistics(name: str) -> None:
    """With the status tested plainly, these plans scanned the whole running (or
    completed) partial index and hash-joined it with the ids: 57-84 ms per batch of
    64 in a 200,000-job drain (see ``sql.by_id_is``)."""
    params = _by_id_params(_stale_statistics())
    statement = getattr(sql, name)
    custom = _plan(statement, params)
    generic = _generic_plan(statement, params)
    for kind, plan in (("custom", custom), ("generic", generic)):
        for index in ("pgjobs_job_running_idx", "pgjobs_job_status_idx", "pgjobs_job_claim_idx"):
            assert index not in plan, f"{name} ({kind} plan) scans {index}: {plan}"
        assert "django_pgjobs_job_pkey" in plan, f"{name} ({kind} plan): {plan}"
