"""A job that kills its worker process must not cost its neighbours an attempt,
while a real crasher still ends in the dead letters: reclaimed,
it runs alone and its next crash is charged to it (tests/process/test_suspects.py).

Real ``runjobs`` subprocesses; timings from tests/settings.py (stale after 2 s)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from django_pgjobs.models import Job
from tests.conftest import WorkerProcess, wait_until
from tests.testapp import jobs

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def query(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def runs() -> Iterator[str]:
    query("CREATE TABLE fair_runs (job_id bigint, lease bigint, pid int)")
    yield "fair_runs"
    query("DROP TABLE IF EXISTS fair_runs")


def test_a_process_killing_job_costs_its_neighbours_nothing(
    start_worker: Callable[..., WorkerProcess], runs: str
) -> None:
    # One attempt each: under the old rule the first crash dead-lettered all four.
    innocents = [
        jobs.record_run.using(queue="fair", max_attempts=1).enqueue(runs, 1.5) for _ in range(3)
    ]
    crasher = jobs.kills_its_process.using(queue="fair").enqueue(0.3)

    first = start_worker("--queues", "fair", "--concurrency", "4")
    assert first.wait(timeout=60) == 3, first.output()  # os._exit(3) took the process down
    rows = {j.id: j for j in Job.objects.filter(queue="fair")}
    assert all(r.status == "running" and r.attempts == 1 for r in rows.values())

    # One job at a time from here, innocents first (the crasher has priority -10).
    # All four are suspects now, each run alone in a child process of its own.
    second = start_worker("--queues", "fair", "--concurrency", "1")
    wait_until(
        lambda: all(Job.objects.get(id=j.id).status == "completed" for j in innocents),
        timeout=60,
        message="the innocent jobs to complete",
    )
    for job in innocents:
        row = Job.objects.get(id=job.id)
        assert (row.status, row.attempts, row.suspect) == ("completed", 1, False)
        [lost] = row.errors
        assert lost["type"] == "django_pgjobs.exceptions.WorkerLost" and lost["refunded"] is True
    assert sorted(r[0] for r in query(f"SELECT job_id FROM {runs}")) == sorted(
        j.id for j in innocents
    )  # each ran to the end exactly once

    # The crasher struck again, in its own process this time: that run is charged to
    # it (max_attempts = 1: dead), and the worker lives on.
    wait_until(
        lambda: Job.objects.get(id=crasher.id).status == "dead",
        timeout=60,
        message="the crasher to be dead-lettered",
    )
    row = Job.objects.get(id=crasher.id)
    assert [e["type"] for e in row.errors] == [
        "django_pgjobs.exceptions.WorkerLost",
        "django_pgjobs.exceptions.JobCrashed",
    ]
    assert row.errors[0]["refunded"] is True
    assert "the job killed its process (exit 3)" in (row.last_error or "")
    assert second.proc.poll() is None, second.output()  # nothing kills the second worker
