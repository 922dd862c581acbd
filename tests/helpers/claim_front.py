"""A clock for the claim front's rules, and workers and rows for its tests with a worker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg

from django_pgjobs.db.tables import JOB
from django_pgjobs.models import Job
from django_pgjobs.worker import Worker
from tests.conftest import dsn

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def running_in_thread(worker: Worker) -> Iterator[Worker]:
    """``worker`` run in a thread of the test, stopped afterwards."""
    # The test app registers tasks with a concurrency key, which send every claim
    # through the limited claim (it ranks every pending job and takes no bound); a
    # site without them claims like this.
    worker.claimant.keyed = False
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(30)
        assert not thread.is_alive()


def job_status(job_id: int) -> str:
    return Job.objects.filter(id=job_id).values_list("status", flat=True).get()


def unannounced(queue: str, run_at: datetime, priority: int = 0) -> int:
    """A pending no-op job inserted by hand: no NOTIFY at all."""
    with psycopg.connect(dsn(), autocommit=True) as other:
        row = other.execute(
            f"INSERT INTO {JOB} (task, queue, priority, args, kwargs, max_attempts, run_at)"
            " VALUES ('tests.testapp.jobs.noop', %s, %s, '[]', '{}', 3, %s) RETURNING id",
            [queue, priority, run_at],
        ).fetchone()
    assert row is not None
    return int(row[0])
