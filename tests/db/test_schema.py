"""The schema: indexes, constraints, autovacuum parameters and the migration itself."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from django_pgjobs import claim
from django_pgjobs.states import ACTIVE, ALLOWED_TRANSITIONS, TERMINAL, JobStatus, can_move

pytestmark = pytest.mark.django_db


def _indexes() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'django_pgjobs_job'"
        )
        return dict(cursor.fetchall())


def test_claim_index_is_partial_on_pending() -> None:
    indexes = _indexes()
    claim_idx = indexes["pgjobs_job_claim_idx"]
    assert "(queue, priority DESC, run_at, id)" in claim_idx
    assert "WHERE ((status)::text = 'pending'::text)" in claim_idx
    assert "WHERE ((status)::text = 'running'::text)" in indexes["pgjobs_job_running_idx"]
    assert "idempotency_key IS NOT NULL" in indexes["pgjobs_job_idempotency_key_uniq"]


def test_no_foreign_keys_on_the_pgjobs_tables() -> None:
    """Not even a durable job's steps and signals name their job by a foreign key: its
    check would lock the running job's row at every insert (the pruner deletes them
    with their job instead)."""
    with connection.cursor() as cursor:
        cursor.execute("""SELECT conrelid::regclass::text, confrelid::regclass::text
                            FROM pg_constraint WHERE contype = 'f'
                             AND (conrelid::regclass::text LIKE 'django_pgjobs_%%'
                                  OR confrelid::regclass::text LIKE 'django_pgjobs_%%')""")
        assert cursor.fetchall() == []


def test_autovacuum_parameters_are_set() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'django_pgjobs_job'")
        (options,) = cursor.fetchone()
    assert set(options) == {
        "autovacuum_vacuum_scale_factor=0.05",
        "autovacuum_vacuum_threshold=500",
        "autovacuum_vacuum_cost_limit=1000",
        "autovacuum_vacuum_cost_delay=2",
    }


def _explain(statement: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_claim_plan_uses_the_partial_index() -> None:
    # History dwarfs live work: 20k finished rows, 50 pending.
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO django_pgjobs_job (task, status, finished_at, attempts, queue)
            SELECT 'x', 'completed', now(), 1, 'default' FROM generate_series(1, 20000)""")
        cursor.execute("""INSERT INTO django_pgjobs_job (task) SELECT 'x'
                          FROM generate_series(1, 50)""")
        cursor.execute("ANALYZE django_pgjobs_job")
    for statement, params in [
        (
            claim.claim_statements()["JOB_CLAIM_ONE_QUEUE"],
            {"queue": "default", "n": 10, "worker": "w", "since": claim.UNBOUNDED},
        ),
        (
            claim.claim_statements()["JOB_CLAIM_QUEUES"],
            {"queues": ["default", "emails"], "n": 10, "worker": "w", "since": claim.UNBOUNDED},
        ),
        (
            claim.claim_statements()["JOB_CLAIM_ALL"],
            {"n": 10, "worker": "w", "since": claim.UNBOUNDED},
        ),
    ]:
        plan = _explain(statement, params)
        assert "pgjobs_job_claim_idx" in plan, plan
        assert "Seq Scan on django_pgjobs_job" not in plan, plan


@pytest.mark.parametrize(
    ("columns", "values"),
    [
        ("task, priority", "'x', 101"),
        ("task, status", "'x', 'exploded'"),
        ("task, status", "'x', 'completed'"),  # terminal without finished_at
        ("task, finished_at", "'x', now()"),  # pending with finished_at
        ("task, attempts, max_attempts", "'x', 4, 3"),
        ("task, max_attempts", "'x', 0"),
        ("task, status", "'x', 'blocked'"),  # blocked, waiting for nothing
        ("task, status, waiting", "'x', 'blocked', 0"),
        ("task, status, finished_at, waiting", "'x', 'blocked', now(), 1"),
    ],
)
def test_check_constraints_hold_the_invariants(columns: str, values: str) -> None:
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO django_pgjobs_job ({columns}) VALUES ({values})")


def test_state_machine_is_one_definition() -> None:
    assert {s.value for s in JobStatus} == TERMINAL | ACTIVE
    for src, dst in ALLOWED_TRANSITIONS:
        assert can_move(src, dst)
    assert not can_move(JobStatus.COMPLETED, JobStatus.RUNNING)
    for terminal in TERMINAL:
        # out of a finished status only by a retry: to pending, or, for a workflow
        # node whose parents have not all finished, back to blocked
        assert {dst for (src, dst) in ALLOWED_TRANSITIONS if src == terminal} <= {
            JobStatus.PENDING,
            JobStatus.BLOCKED,
        }
    # a blocked job leaves only to run (pending) or to be cancelled
    assert {dst for (src, dst) in ALLOWED_TRANSITIONS if src == JobStatus.BLOCKED} == {
        JobStatus.PENDING,
        JobStatus.CANCELLED,
    }


@pytest.mark.django_db(transaction=True)
def test_migration_applies_backwards_and_forwards() -> None:
    call_command("migrate", "django_pgjobs", "zero", verbosity=0)
    assert "django_pgjobs_job" not in connection.introspection.table_names()
    call_command("migrate", "django_pgjobs", verbosity=0)
    assert {"django_pgjobs_job", "django_pgjobs_jobresult", "django_pgjobs_worker"} <= set(
        connection.introspection.table_names()
    )
    test_autovacuum_parameters_are_set()
