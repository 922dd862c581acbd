"""The one error-entry builder (``errors.error_entry``): every text it records can be
stored, so a failure is retried as the job says, never dead-lettered because its own
error entry was refused by PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from tests.testapp.jobs import fault_poison


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_records_when_it_started() -> None:
    """Through the worker's path: the attempt's start, taken before its handler ran."""
    before = datetime.now(UTC)
    job = fault_poison.enqueue("raise")
    run_jobs(max_jobs=1)
    entry = Job.objects.get(id=job.id).errors[-1]
    started = datetime.fromisoformat(entry["started_at"])
    assert before <= started <= datetime.fromisoformat(entry["at"])


@pytest.mark.django_db(transaction=True)
def test_an_exception_named_with_a_lone_surrogate_is_retried_not_dead_lettered() -> None:
    job = fault_poison.enqueue("surrogate_type")  # max_attempts=2
    ran = run_jobs(max_jobs=1)
    assert [r.status for r in ran] == ["pending"], "attempt 1 of 2 is retried"
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == ("pending", 1)
    [entry] = row.errors
    assert entry["attempt"] == 1
    assert entry["type"] == "tests.testapp.jobs.FaultSurrogate\\ud800"
    assert row.last_error and "FaultSurrogate\\ud800" in row.last_error
