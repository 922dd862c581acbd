"""A worker behind Django's connection pool (``OPTIONS["pool"]``, Django 5.1+): its
threads each hold a connection, and a pool sized for a web process must not starve
them (django_pgjobs/worker/connection_pool.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_pgjobs.models import Job
from django_pgjobs.worker.connection_pool import fit_pool, own_connections, pool_max_size
from tests.conftest import wait_until
from tests.testapp import jobs

pytestmark = pytest.mark.process

POOLED = {"DJANGO_SETTINGS_MODULE": "tests.settings_pool"}


@pytest.fixture
def table(transactional_db: Any) -> Iterator[str]:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE pool_runs (job_id bigint, lease bigint)")
    yield "pool_runs"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE pool_runs")


def _run_all(start_worker: Any, table: str, env: dict[str, str], *, n: int = 8) -> Any:
    """``n`` atomic jobs, each holding its connection for a second, on ``n`` threads."""
    ids = [jobs.atomic_insert.enqueue(table, 1.0).id for _ in range(n)]
    worker = start_worker("--concurrency", str(n), env=env)
    wait_until(
        lambda: Job.objects.filter(id__in=ids, status="completed").count() == n,
        timeout=60,
        message=f"the {n} jobs to complete",
    )
    assert set(Job.objects.filter(id__in=ids).values_list("attempts", flat=True)) == {1}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*), count(DISTINCT job_id) FROM {table}")
        assert cursor.fetchone() == (n, n)
    worker.signal(15)
    assert worker.wait(timeout=30) == 0, worker.output()
    out = worker.output()
    assert "couldn't get a connection" not in out, out
    assert "Traceback" not in out, out
    return out


def test_a_worker_widens_a_narrow_pool_and_says_so(start_worker: Any, table: str) -> None:
    """A pool of 4 (psycopg_pool's default) and 8 job threads that each hold a
    connection for a second: without the widening, the claimer, completer, heartbeat and
    maintenance threads hold the 4 and every job fails waiting 2 s for one."""
    out = _run_all(start_worker, table, POOLED)
    assert "Django's connection pool hands out at most 4 connections" in out, out
    assert "widened to max_size=" in out, out


def test_a_pool_wide_enough_is_left_as_configured(start_worker: Any, table: str) -> None:
    out = _run_all(start_worker, table, {**POOLED, "PGJOBS_TEST_POOL_MAX": "100"})
    assert "widened" not in out, out


@pytest.mark.parametrize(
    ("options", "size"),
    [(True, 4), ({}, 4), ({"min_size": 2}, 2), ({"min_size": 2, "max_size": 9}, 9)],
)
def test_the_pool_size_is_read_as_psycopg_pool_reads_it(options: Any, size: int) -> None:
    assert pool_max_size(options) == size


def test_own_connections_count_each_thread_that_holds_one() -> None:
    # claimer, completer, heartbeat, metrics (+ reaper and maintenance, + async ORM thread)
    assert own_connections(maintenance=0, use_async=False) == 4
    assert own_connections(maintenance=2, use_async=True) == 7


@pytest.mark.django_db  # the test runs inside a transaction, as a TestCase does
def test_a_worker_started_inside_a_transaction_leaves_the_pool_and_the_transaction(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Widening closes the caller's connection first; inside atomic() that ended the
    caller's transaction (Django marks it for rollback): its writes were gone."""
    queued = jobs.noop.enqueue()  # uncommitted, in the test's transaction
    options = {
        **connection.settings_dict.get("OPTIONS", {}),
        "pool": {"min_size": 1, "max_size": 2},
    }
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    with caplog.at_level("WARNING", logger="django_pgjobs"):
        assert fit_pool(connection.alias, jobs=4, abandoned=4, own=5) is None
    assert "started inside a transaction" in caplog.text
    assert connection.in_atomic_block and not connection.needs_rollback
    assert Job.objects.filter(id=queued.id).exists()
