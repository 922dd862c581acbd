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
import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from psycopg import sql as psycopg_sql

from django_pgjobs import claim
from django_pgjobs.db import job_admin, job_outcome
from django_pgjobs.db.error_history import error_params
from django_pgjobs.db.job_outcome import job_complete_many
from django_pgjobs.db.tables import JOB, RESULT
from django_pgjobs.worker.runners import JobRunners
from tests.helpers.plans import HISTORY, explain_json, fill_jobs, numbered_placeholders


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("statement", "extra"),
    [
        (claim.claim_statements()["JOB_CLAIM_ONE_QUEUE"], {"queue": "default"}),
        (claim.claim_statements()["JOB_CLAIM_QUEUES"], {"queues": ["default", "emails"]}),
        (claim.claim_statements()["JOB_CLAIM_ALL"], {}),
        (
            claim.claim_statements()["JOB_CLAIM_LEVELS"],
            {"queues": ["default", "emails"], "levels": [5, 0]},
        ),
    ],
    ids=["one-queue", "queues", "all", "levels"],
)
def test_claim_uses_the_partial_index_with_a_large_history(statement: str, extra: dict) -> None:
    fill_jobs(HISTORY, 1000)
    plan = explain_json(statement, {"worker": "w", "n": 100, "since": claim.UNBOUNDED, **extra})
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
        ("JOB_CLAIM_LEVELS", {"queues": ["default", "emails"], "levels": [5, 0]}),
    ],
    ids=["one-queue", "queues", "all", "levels"],
)
def test_claim_finds_its_rows_by_primary_key_before_the_statistics_catch_up(
    name: str, extra: dict
) -> None:
    """A table analysed while empty, then filled by a bulk enqueue (autovacuum has
    not analysed it again yet): joined as ``FROM picked WHERE j.id = picked.id``,
    the claim's generic plan hashed a sequential scan of the whole table, a cost per
    claim that grows with the table. Now a primary-key probe per id (``_CLAIM_SET``, shared
    by the three: with the old join this fixture flips the every-queue claim)."""
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {JOB}")
    fill_jobs(0, 30_000, analyze=False)
    plan = _generic_plan(
        claim.claim_statements()[name], {"worker": "w", "n": 100, "since": claim.UNBOUNDED, **extra}
    )
    assert '"Node Type": "Seq Scan"' not in plan, plan
    assert "Hash Join" not in plan, plan
    assert "django_pgjobs_job_pkey" in plan, plan


@pytest.mark.django_db
def test_claim_and_complete_are_one_statement_each_without_savepoints() -> None:
    fill_jobs(0, 200, queues=("default",))
    with CaptureQueriesContext(connection) as claimed_q:
        claimed = claim.claim(connection, worker="w", queues=["default"], n=150)
    assert len(claimed) == 150
    with CaptureQueriesContext(connection) as done_q:
        done = job_complete_many(connection, [(c.id, c.lease, {"i": c.id}) for c in claimed])
    assert done == {c.id for c in claimed}
    queries = [q["sql"] for q in (*claimed_q.captured_queries, *done_q.captured_queries)]
    assert len(claimed_q.captured_queries) == 1, queries
    assert len(done_q.captured_queries) == 1, queries
    assert not any("SAVEPOINT" in q.upper() for q in queries), queries


@pytest.mark.django_db
def test_no_foreign_key_touches_the_jobs_table() -> None:
    """No foreign key from or onto the jobs table, nor from the results: a claim, a
    completion, a step or a signal insert checks none (a check would lock the job's
    row, docs/explanation/postgres-pitfalls.md)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' AND ("
            f" conrelid = '{JOB}'::regclass OR confrelid = '{JOB}'::regclass"
            f" OR conrelid = '{RESULT}'::regclass)"
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
            f"INSERT INTO {JOB} (task, queue, run_at)"
            " SELECT 'live', 'default', now() - interval '1 second'"
            " FROM generate_series(1, 20000)"
        )
        cur.execute(f"ANALYZE {JOB}")
        cur.execute(
            f"UPDATE {JOB} SET status = 'completed', attempts = 1, started_at = now(),"
            " finished_at = now() WHERE id IN (SELECT id FROM django_pgjobs_job ORDER BY id"
            " LIMIT 10000)"
        )
        cur.execute(
            f"UPDATE {JOB} SET status = 'running', attempts = 1, lease = 1,"
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
        "still_running": True,
        "suspect": False,
        "chunk_run": None,
        "runs": ["00000000-0000-4000-8000-000000000001"] * len(ids),
        **error_params(error),
    }


def _generic_plan(statement: str, params: dict[str, Any]) -> str:
    """The plan a prepared statement gets after its fifth run (PREPARE setting)."""
    with connection.cursor() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        numbered, names = numbered_placeholders(statement)
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


STATEMENTS = {
    "JOB_COMPLETE_MANY": job_outcome.JOB_COMPLETE_MANY,
    "JOB_COMPLETE_MANY_REDO": job_outcome.JOB_COMPLETE_MANY_REDO,
    "JOB_COMPLETE_CHUNK": job_outcome.JOB_COMPLETE_CHUNK,
    "JOB_HEARTBEAT": job_outcome.JOB_HEARTBEAT,
    "JOB_RETRY": job_outcome.JOB_RETRY,
    "JOB_TIMED_OUT": job_outcome.JOB_TIMED_OUT,
    "JOB_DEAD": job_outcome.JOB_DEAD,
    "JOB_RELEASE": job_outcome.JOB_RELEASE,
    "JOB_RELEASE_MANY": job_outcome.JOB_RELEASE_MANY,
    "JOB_CANCEL": job_admin.JOB_CANCEL,
}
BY_ID = ["JOB_COMPLETE_MANY", "JOB_COMPLETE_MANY_REDO", "JOB_COMPLETE_CHUNK", "JOB_HEARTBEAT", "JOB_RETRY", "JOB_TIMED_OUT", "JOB_DEAD",
         "JOB_RELEASE", "JOB_RELEASE_MANY", "JOB_CANCEL"]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("name", BY_ID)
def test_writes_by_id_use_the_primary_key_even_with_stale_statistics(name: str) -> None:
    """With the status tested plainly, these plans scanned the whole running (or
    completed) partial index and hash-joined it with the ids, a cost per batch that
    grows with the table (see ``by_id_is``)."""
    params = _by_id_params(_stale_statistics())
    statement = STATEMENTS[name]
    custom = explain_json(statement, params)
    generic = _generic_plan(statement, params)
    for kind, plan in (("custom", custom), ("generic", generic)):
        for index in ("pgjobs_job_running_idx", "pgjobs_job_status_idx", "pgjobs_job_claim_idx"):
            assert index not in plan, f"{name} ({kind} plan) scans {index}: {plan}"
        assert "django_pgjobs_job_pkey" in plan, f"{name} ({kind} plan): {plan}"


def _many_running(n: int = 20_000, batch: int = 300) -> list[tuple[int, int]]:
    """``n`` running jobs, freshly analysed (a busy drain's table: every row claimed):
    returns (id, lease) of ``batch`` of them from the middle."""
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, run_at, status, attempts, lease, started_at,"
            " heartbeat_at, worker) SELECT 'live', 'default', now(), 'running', 1, 1, now(),"
            " now(), 'w' FROM generate_series(1, %s)",
            [n],
        )
        cur.execute(f"ANALYZE {JOB}")
        cur.execute(f"SELECT id, lease FROM {JOB} ORDER BY id OFFSET %s LIMIT %s", [n // 4, batch])
        return [(r[0], r[1]) for r in cur.fetchall()]


@pytest.mark.django_db
@pytest.mark.parametrize("name", BY_ID)
def test_writes_by_id_probe_the_primary_key_with_thousands_running(name: str) -> None:
    """A join of the ids with the table left to the planner was a hash join over a
    sequential scan of every running row once the table held thousands (cheaper in
    its cost model, far dearer in fact), which slows the whole drain. Each of these
    statements reaches its rows through the primary key."""
    params = _by_id_params(_many_running())
    statement = STATEMENTS[name]
    for kind, plan in (
        ("custom", explain_json(statement, params)),
        ("generic", _generic_plan(statement, params)),
    ):
        assert JOB not in _seq_scanned(json.loads(plan)), f"{name} ({kind} plan): {plan}"
        assert "django_pgjobs_job_pkey" in plan, f"{name} ({kind} plan): {plan}"


def _seq_scanned(node: Any) -> set[str]:
    """The tables a JSON plan reads with a sequential scan."""
    if isinstance(node, list):
        return set().union(*(_seq_scanned(n) for n in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["Relation Name"]} if node.get("Node Type") == "Seq Scan" else set()
    for child in (node.get("Plan"), node.get("Plans")):
        found |= _seq_scanned(child) if child is not None else set()
    return found
