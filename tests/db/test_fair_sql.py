"""Fair keys from SQL: ``pgjobs_enqueue(fair_key => ...)`` puts a row enqueued by SQL
(pg_cron, a trigger) into the fair claim's rotation, as ``@job(fair_key=...)`` does
from Python; without it, the row waits for room the rotation leaves."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import DataError, ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from tests import fair_jobs
from tests.helpers.fair import FAIR_TASKS, many

db = pytest.mark.django_db


def due_now() -> datetime:
    """A run_at already due in the test's transaction (the column's default is the
    statement's time, later than the transaction's now() the claim compares with)."""
    return timezone.now() - timedelta(seconds=1)


def sql_enqueue(task: str, **named: Any) -> int | None:
    casts = {"args": "::jsonb", "kwargs": "::jsonb"}
    args = "".join(f", {name} => %s{casts.get(name, '')}" for name in named)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pgjobs_enqueue(%s{args})", [task, *named.values()])
        value: int | None = cursor.fetchone()[0]
    return value


def claimed_by_two_claims_of_two() -> set[int]:
    """What a worker takes in two claims of two from the queue "fair", where the
    rotation over the keys with due jobs fills each ask."""
    state = Claimant(["fair"], FAIR_TASKS, worker="w", refresh=0.0)
    return {c.id for _ in range(2) for c in state.take(connection, 2)}


@db
def test_a_row_enqueued_by_sql_with_a_fair_key_takes_its_turn_beside_a_backlog() -> None:
    many("a", 50)
    task = fair_jobs.tenant_job.name
    bare = sql_enqueue(task, args='["b", 0]', queue="fair", run_at=due_now())
    keyed = sql_enqueue(task, args='["c", 0]', queue="fair", run_at=due_now(), fair_key="tenant:c")
    assert Job.objects.get(id=keyed).fair_key == "tenant:c"
    assert Job.objects.get(id=bare).fair_key is None
    taken = claimed_by_two_claims_of_two()
    # the keyed row is in the rotation (a, c); the bare one waits while "a" fills the ask
    assert keyed in taken and bare not in taken, taken


@db
def test_an_empty_fair_key_joins_the_turn_of_the_jobs_without_a_key() -> None:
    many("a", 50)
    python = fair_jobs.unkeyed.using(run_at=due_now()).enqueue(1).id
    shared = sql_enqueue(
        fair_jobs.unkeyed.name, args="[2]", queue="fair", run_at=due_now(), fair_key=""
    )
    assert set(Job.objects.filter(id__in=[python, shared]).values_list("fair_key", flat=True)) == {
        ""
    }
    # one turn for the key "" a round: each claim of two takes an "a" and one of them
    assert {python, shared} <= claimed_by_two_claims_of_two()


@db
def test_a_debounced_enqueue_from_sql_stores_its_fair_key() -> None:
    first = sql_enqueue(
        fair_jobs.tenant_job.name,
        args='["d", 0]',
        queue="fair",
        debounce=timedelta(seconds=5),
        debounce_key="d",
        fair_key="tenant:d",
    )
    again = sql_enqueue(
        fair_jobs.tenant_job.name,
        args='["d", 1]',
        queue="fair",
        debounce=timedelta(seconds=5),
        debounce_key="d",
        fair_key="tenant:d",
    )
    assert first == again
    row = Job.objects.get(id=first)
    assert (row.fair_key, row.args) == ("tenant:d", ["d", 1])


@db
def test_a_fair_key_over_255_characters_is_refused_naming_it() -> None:
    refused = pytest.raises((DataError, ProgrammingError), match="fair_key must be at most 255")
    with refused, transaction.atomic():
        sql_enqueue(fair_jobs.tenant_job.name, args='["e", 0]', fair_key="k" * 256)
    assert not Job.objects.exists()


@db
def test_calls_of_the_older_arguments_mean_what_they_meant() -> None:
    """One function, its newest signature: a positional call of the first eight or
    twelve arguments resolves to it (no older overload left to make it ambiguous)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_function_identity_arguments(p.oid) FROM pg_proc p"
            " WHERE p.proname = 'pgjobs_enqueue'"
        )
        signatures = [r[0] for r in cursor.fetchall()]
        assert len(signatures) == 1 and signatures[0].endswith("keep text, fair_key text")
        cursor.execute(
            "SELECT pgjobs_enqueue(%s, '[\"f\", 0]', '{}', 'fair', 0, NULL, NULL, 3)",
            [fair_jobs.tenant_job.name],
        )
        eight = cursor.fetchone()[0]
        cursor.execute(
            "SELECT pgjobs_enqueue(%s, '[\"g\", 0]', '{}', 'fair', 0, NULL, NULL, 3,"
            " NULL, NULL, NULL, NULL)",
            [fair_jobs.tenant_job.name],
        )
        twelve = cursor.fetchone()[0]
    rows = Job.objects.filter(id__in=[eight, twelve])
    assert sorted(rows.values_list("max_attempts", "fair_key")) == [(3, None), (3, None)]


@db
def test_run_jobs_reads_the_fair_queues_once_a_call_and_still_rotates() -> None:
    """testing.run_jobs re-reads the queue rows before each claim (a pause between two
    jobs is seen), but the fair queues once: a claim costs one statement more, not two."""
    for tenant, count in (("a", 3), ("b", 1), ("c", 1)):
        for i in range(count):
            fair_jobs.tenant_job.using(run_at=due_now()).enqueue(tenant, i)
    with CaptureQueriesContext(connection) as captured:
        ran = run_jobs(queues=["fair"])
    keys = dict(Job.objects.values_list("id", "fair_key"))
    assert [keys[r.id] for r in ran] == [
        "tenant:a",
        "tenant:b",
        "tenant:c",
        "tenant:a",
        "tenant:a",
    ]
    statements = [q["sql"] for q in captured.captured_queries]
    assert len([s for s in statements if "fq(name)" in s]) == 1, statements
    limits = [s for s in statements if s.lstrip().startswith("SELECT name, paused, max_running")]
    assert len(limits) == 6, statements  # five claims and the empty one
