"""A job's database connection in a real ``runjobs`` process (in-process:
tests/db/test_job_connection.py)."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgjobs.models import Job
from tests.conftest import wait_until
from tests.helpers.job_connection import idle_in_transaction, numbers_in
from tests.testapp import core_jobs


@pytest.mark.process
def test_an_async_job_timed_out_inside_a_transaction_does_not_leave_it_open(
    start_worker: Any, table: str
) -> None:
    """Cancelled at its timeout, the job never returns to be checked: its transaction
    sat idle, holding the xmin horizon, until another async job returned."""
    stuck = core_jobs.async_times_out_in_a_transaction.enqueue(table)
    worker = start_worker("--concurrency", "1")
    wait_until(lambda: Job.objects.get(id=stuck.id).status == "dead", timeout=20)
    wait_until(lambda: idle_in_transaction() == 0, timeout=10, message="no idle transaction")
    assert worker.proc.poll() is None, worker.output()
    assert numbers_in(table) == []
