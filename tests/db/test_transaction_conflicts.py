"""An atomic job whose transaction loses a race (a serialization failure or a
deadlock) is run again within its attempt: the server rolled the whole transaction
back, its writes with it, and under SERIALIZABLE the completion's own index reads
conflict with the neighbours' completions (worker/executor.py, CONFLICT_RERUNS).
The races here are real: tests/testapp/jobs.py ``loses_races``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_pgjobs.models import Job
from django_pgjobs.worker.executor import CONFLICT_RERUNS
from django_pgjobs.worker.failure_kinds import is_transaction_conflict
from django_pgjobs.worker.loop import Worker
from tests.conftest import run_burst_worker
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "races"


@pytest.fixture
def tables() -> Iterator[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TABLE} (job_id bigint, lease bigint)")
        cursor.execute(f"CREATE TABLE {TABLE}_runs (run bigserial, job_id bigint)")
        cursor.execute(f"CREATE TABLE {TABLE}_counter (id int PRIMARY KEY, n int)")
        cursor.execute(f"INSERT INTO {TABLE}_counter VALUES (1, 0)")
    yield TABLE
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {TABLE}, {TABLE}_runs, {TABLE}_counter")


def _count(sql: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]  # type: ignore[index]


def _run(job: Job) -> Job:
    """Burst workers until ``job`` is finished (a retry waits for its backoff)."""
    deadline = time.monotonic() + 30
    while (row := Job.objects.get(id=job.id)).status not in ("completed", "dead"):
        assert time.monotonic() < deadline, f"job {job.id} still {row.status}"
        worker = Worker(burst=True, maintenance=False, concurrency=1)
        assert run_burst_worker(worker) == 0
        time.sleep(0.05)  # a retry's backoff (the status is the condition, not this)
    return row


def test_a_transaction_that_lost_a_race_runs_again_in_the_same_attempt(tables: str) -> None:
    job = jobs.loses_races.enqueue(tables, 2)
    done = _run(job)
    assert (done.status, done.attempts, done.errors) == ("completed", 1, [])
    assert done.result == 3  # the third run committed
    assert _count(f"SELECT count(*) FROM {tables}_runs") == 3
    assert _count(f"SELECT count(*) FROM {tables}") == 1  # the job's write, once
    assert _count(f"SELECT n FROM {tables}_counter") == 3  # two rivals and ours


def test_past_its_reruns_the_race_is_a_failed_attempt(tables: str) -> None:
    runs = CONFLICT_RERUNS + 1
    job = jobs.loses_races.enqueue(tables, runs)
    done = _run(job)  # the first attempt fails; its retry (run runs + 1) wins
    assert (done.status, done.attempts) == ("completed", 2)
    assert [e["attempt"] for e in done.errors] == [1]
    assert "could not serialize access" in done.errors[0]["message"]
    assert _count(f"SELECT count(*) FROM {tables}_runs") == runs + 1
    assert _count(f"SELECT count(*) FROM {tables}") == 1


def test_only_serialization_failures_and_deadlocks_are_conflicts() -> None:
    import psycopg

    with psycopg.connect(**_params(), autocommit=True) as conn:
        for sql, conflict in (
            ("SELECT 1/0", False),
            ("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001'; END $$", True),
            ("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40P01'; END $$", True),
            ("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '55P03'; END $$", False),
        ):
            with pytest.raises(psycopg.Error) as raised:
                conn.execute(sql)
            assert is_transaction_conflict(raised.value) is conflict, sql


def _params() -> dict[str, Any]:
    from django_pgjobs.support.pgconn import psycopg_params

    return psycopg_params("default")
