"""Sizes bounded by settings: return values (MAX_RESULT_BYTES)
and the error history (MAX_ERRORS_KEPT) on every path that appends to it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_pgjobs.db.job_admin import job_retry_now
from django_pgjobs.db.job_outcome import job_dead, job_retry
from django_pgjobs.db.reap import job_reap_stale
from django_pgjobs.models import Job, JobResult
from django_pgjobs.testing import run_jobs
from tests.helpers.rows import make_job
from tests.testapp.jobs import echo_value

pytestmark = pytest.mark.django_db

KEPT = 3


@pytest.fixture
def bounded(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "MAX_ERRORS_KEPT": KEPT, "MAX_RESULT_BYTES": 1000}


def _entry(n: int, **extra: Any) -> dict[str, Any]:
    return {"attempt": n, "type": "builtins.ValueError", "message": f"old {n}", **extra}


def _running_with_history(n: int, **kwargs: Any) -> Job:
    job = make_job("running", heartbeat_age=30, attempts=1, max_attempts=5, **kwargs)
    Job.objects.filter(id=job.id).update(errors=[_entry(i) for i in range(1, n + 1)])
    return job


def test_a_return_value_over_max_result_bytes_fails_its_job_clearly(bounded: None) -> None:
    small = echo_value.enqueue("x" * 100)
    big = echo_value.enqueue("x" * 2000)
    ran = {r.id: r for r in run_jobs()}
    assert ran[small.id].status == "completed"
    assert ran[big.id].status == "dead"  # not retried: running it again returns the same
    row = Job.objects.get(id=big.id)
    assert row.attempts == 1
    assert "MAX_RESULT_BYTES" in (row.last_error or "") and "2,0" in (row.last_error or "")
    assert not JobResult.objects.filter(job_id=big.id).exists()


def test_retry_and_dead_keep_the_newest_entries(bounded: None) -> None:
    for write in ("retry", "dead"):
        job = _running_with_history(5)
        error = _entry(6, message="newest")
        if write == "retry":
            assert job_retry(connection, id=job.id, lease=1, delay=0, error=error)
        else:
            assert job_dead(connection, id=job.id, lease=1, error=error)
        errors = Job.objects.get(id=job.id).errors
        assert [e["attempt"] for e in errors] == [4, 5, 6], write
        assert errors[-1]["message"] == "newest"


def test_the_reaper_keeps_the_newest_entries(bounded: None) -> None:
    job = _running_with_history(5)
    job_reap_stale(connection, stale_after=10)
    errors = Job.objects.get(id=job.id).errors
    assert [e["attempt"] for e in errors] == [4, 5, 1]
    assert errors[-1]["type"] == "django_pgjobs.exceptions.WorkerLost"


def test_admin_retry_trims_and_forgives_lost_workers(bounded: None) -> None:
    job = make_job("dead", attempts=5)
    lost = {"type": "django_pgjobs.exceptions.WorkerLost", "refunded": True}
    Job.objects.filter(id=job.id).update(
        errors=[_entry(1), _entry(2), _entry(3, **lost), _entry(4, **lost)]
    )
    assert job_retry_now(connection, [job.id], stale_after=60).changed == {job.id}
    errors = Job.objects.get(id=job.id).errors
    assert [e["attempt"] for e in errors] == [2, 3, 4]
    assert [e.get("refunded") for e in errors] == [None, False, False]


def test_a_job_failing_forever_keeps_a_bounded_history(bounded: None) -> None:
    job = make_job("pending", max_attempts=50, task="tests.testapp.jobs.always_fails", args=[])
    Job.objects.filter(id=job.id).update(max_attempts=50)
    for _ in range(8):
        with connection.cursor() as cursor:
            cursor.execute("UPDATE django_pgjobs_job SET run_at = now() - interval '1 s'")
        run_jobs()
    row = Job.objects.get(id=job.id)
    assert row.attempts == 8 and len(row.errors) == KEPT
    assert [e["attempt"] for e in row.errors] == [6, 7, 8]
    assert len(row.last_error or "") <= 10_000


@pytest.mark.django_db(transaction=True)
def test_the_pg_cron_reaper_entry_renders_and_runs(bounded: None) -> None:
    """``sync_cron --pg-cron --maintenance`` installs the reaper's statement as text."""
    import psycopg

    from django_pgjobs.maintenance.pg_cron_engine import REAP_ENTRY, maintenance_entries
    from tests.conftest import dsn

    job = _running_with_history(5)
    with psycopg.connect(dsn(), autocommit=True) as conn:
        [reap] = [e for e in maintenance_entries(conn) if e.jobname == REAP_ENTRY]
        conn.execute(reap.command)  # STALE_AFTER is 2 s; the heartbeat is 30 s old
    row = Job.objects.get(id=job.id)
    assert (row.status, row.attempts) == ("pending", 0)
    assert [e["attempt"] for e in row.errors] == [4, 5, 1]
