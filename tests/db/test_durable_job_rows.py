"""A durable job's steps and signals name their job by a plain ``job_id``: no foreign
key onto the jobs table (its check would lock the running job's row at every insert,
docs/explanation/postgres-pitfalls.md), and they go with their job all the same: in the
pruner's statement and in an ORM delete (the admin's)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from django_pgjobs import send_signal
from django_pgjobs.db.prune import JOB_PRUNE_BATCH
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.models import Job, JobSignal, JobStep
from django_pgjobs.testing import run_jobs
from tests import durable_jobs
from tests.conftest import dsn
from tests.durable_jobs import CALLS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


def _finished_job_with_steps_and_signals() -> int:
    """A completed durable job with two steps, one consumed signal and one kept."""
    job = durable_jobs.many_steps.enqueue(2)
    send_signal(job.id, "a")
    send_signal(job.id, "b", idempotency_key="k")
    [ran] = run_jobs()
    assert ran.status == "completed"
    JobSignal.objects.filter(job_id=job.id, name="a").update(
        consumed_at=timezone.now(), consumed_by="a#0"
    )
    return job.id


def _rows(job_id: int) -> tuple[int, int]:
    return (
        JobStep.objects.filter(job_id=job_id).count(),
        JobSignal.objects.filter(job_id=job_id).count(),
    )


def test_no_foreign_key_names_the_jobs_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text FROM pg_constraint"
            " WHERE contype = 'f' AND confrelid = 'django_pgjobs_job'::regclass"
        )
        assert cursor.fetchall() == []


def test_the_pruner_deletes_a_pruned_jobs_steps_and_signals_and_no_others() -> None:
    pruned = _finished_job_with_steps_and_signals()
    kept = _finished_job_with_steps_and_signals()
    assert _rows(pruned) == _rows(kept) == (2, 2)
    Job.objects.filter(id=pruned).update(finished_at=F("finished_at") - timedelta(days=30))
    assert Pruner().run_once()["by_status"]["completed"] == 1
    assert not Job.objects.filter(id=pruned).exists()
    assert _rows(pruned) == (0, 0)
    assert _rows(kept) == (2, 2)


def test_an_orm_delete_of_a_job_takes_its_steps_and_signals_along() -> None:
    """The admin's delete goes through the ORM: Django's cascade deletes the rows."""
    gone, kept = _finished_job_with_steps_and_signals(), _finished_job_with_steps_and_signals()
    Job.objects.get(id=gone).delete()
    assert _rows(gone) == (0, 0)
    assert _rows(kept) == (2, 2)


@pytest.mark.django_db(transaction=True)
def test_a_step_or_signal_insert_waits_for_no_lock_on_its_jobs_row() -> None:
    """Another transaction holds the job's row FOR UPDATE (as a claim does): a foreign
    key's check (FOR KEY SHARE on that row) would wait for it; the inserts do not."""
    job = durable_jobs.many_steps.enqueue(1)
    with psycopg.connect(dsn(), autocommit=False) as holder:
        holder.execute("SELECT 1 FROM django_pgjobs_job WHERE id = %s FOR UPDATE", [job.id])
        with psycopg.connect(dsn(), autocommit=False) as writer:
            writer.execute("SET LOCAL lock_timeout = '2s'")
            writer.execute(
                "INSERT INTO django_pgjobs_jobstep (job_id, seq, name, kind)"
                " VALUES (%s, 0, 'x', 'step')",
                [job.id],
            )
            writer.execute(
                "INSERT INTO django_pgjobs_jobsignal (job_id, name) VALUES (%s, 'x')", [job.id]
            )
            writer.commit()
        holder.rollback()
    assert _rows(job.id) == (1, 1)


def test_the_prune_statement_finds_steps_and_signals_by_their_job_index() -> None:
    """Many steps and signals of other jobs: the pruner's delete of a batch's rows
    probes the indexes that lead with job_id, never scanning either table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_pgjobs_job (task, status, run_at)"
            " SELECT 'x', 'pending', now() FROM generate_series(1, 2000)"
        )
        cursor.execute(
            "INSERT INTO django_pgjobs_jobstep (job_id, seq, name, kind)"
            " SELECT j.id, s, 'n' || s, 'step' FROM django_pgjobs_job j,"
            " generate_series(0, 9) s"
        )
        cursor.execute(
            "INSERT INTO django_pgjobs_jobsignal (job_id, name, consumed_at, consumed_by)"
            " SELECT j.id, 'n', now(), 'n#0' FROM django_pgjobs_job j, generate_series(0, 9)"
        )
        _finished_job_with_steps_and_signals()
        cursor.execute("ANALYZE django_pgjobs_job")
        cursor.execute("ANALYZE django_pgjobs_jobstep")
        cursor.execute("ANALYZE django_pgjobs_jobsignal")
        cursor.execute(
            "EXPLAIN (COSTS OFF) " + JOB_PRUNE_BATCH,
            {"status": "completed", "older_than": 86400, "batch": 1000},
        )
        plan = "\n".join(r[0] for r in cursor.fetchall())
    assert not re.search(r"Seq Scan on django_pgjobs_job(step|signal)?\s", plan), plan
    assert "pgjobs_signal_job_idx" in plan, plan
