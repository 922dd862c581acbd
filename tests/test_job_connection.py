"""A job that returns with a raw transaction open on its connection (``BEGIN``
without ``COMMIT``): its attempt fails, naming why, and the transaction is rolled
back, whether the project's connections close after each job (``CONN_MAX_AGE = 0``:
its writes were rolled back while the job counted as completed) or persist
(``CONN_MAX_AGE = None``: every later job on that thread wrote into the same
uncommitted transaction, which sat "idle in transaction" holding the xmin horizon)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from django_pgjobs.models import Job
from django_pgjobs.worker.loop import Worker
from tests.conftest import run_burst_worker
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def table() -> Iterator[str]:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE left_open (n int)")
    yield "left_open"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE left_open")


def _rows(table: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT n FROM {table} ORDER BY n")
        return [n for (n,) in cursor.fetchall()]


@pytest.mark.parametrize("max_age", [0, None], ids=["closed-after-each-job", "persistent"])
def test_a_job_that_leaves_a_transaction_open_fails_and_its_neighbours_commit(
    table: str, max_age: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", max_age)
    bad = jobs.leaves_transaction_open.using(priority=10).enqueue(table, 1)
    later = [jobs.writes_n.enqueue(table, n) for n in (2, 3)]  # after it, on its thread
    assert run_burst_worker(Worker(burst=True, maintenance=False, concurrency=1)) == 0
    row = Job.objects.get(id=bad.id)
    assert row.status == "dead", row.errors
    assert row.errors[0]["type"] == "django_pgjobs.exceptions.TransactionLeftOpen"
    assert "a BEGIN without COMMIT" in row.errors[0]["message"]
    assert [Job.objects.get(id=j.id).status for j in later] == ["completed", "completed"]
    assert _rows(table) == [2, 3]  # its own write rolled back, the neighbours' committed
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone() == (0,)


def test_jobs_that_query_in_autocommit_are_not_taken_for_leaving_one_open(table: str) -> None:
    done = [jobs.writes_n.enqueue(table, n) for n in range(5)]
    assert run_burst_worker(Worker(burst=True, maintenance=False, concurrency=2)) == 0
    assert {Job.objects.get(id=j.id).status for j in done} == {"completed"}
    assert _rows(table) == [0, 1, 2, 3, 4]
