"""A caller's open transaction never holds up a worker: a real ``runjobs`` process runs
a job that polls for a signal beside another job, and a caller sends the poller a
signal in a transaction it keeps open longer than ``STALE_AFTER``. The worker's
heartbeat goes on for both jobs meanwhile, neither is reaped, and the signal reaches
the poller once the caller commits.

Timings come from tests/settings.py (heartbeat 0.5 s, stale after 2 s)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import psycopg
import pytest
from django.conf import settings
from django.db import transaction

from django_pgjobs import send_signal
from django_pgjobs.models import Job
from tests import signal_jobs
from tests.conftest import WorkerProcess, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Start = Callable[..., WorkerProcess]

STALE_AFTER = float(settings.PGJOBS["STALE_AFTER"])
#: How long the caller keeps its transaction open after the send.
HOLD = 2 * STALE_AFTER + 1


def _row(watcher: psycopg.Connection, job_id: int) -> tuple[str, int, datetime | None, datetime]:
    """(status, lease, heartbeat_at, the database's clock), read on its own connection."""
    row = watcher.execute(
        "SELECT status, lease, heartbeat_at, clock_timestamp() FROM django_pgjobs_job"
        " WHERE id = %s",
        [job_id],
    ).fetchone()
    assert row is not None
    return row


def test_a_caller_holding_a_signal_open_stalls_no_heartbeat(
    start_worker: Start, other_connection: psycopg.Connection
) -> None:
    start_worker("--queues", "durable", "--concurrency", "2")
    poller = signal_jobs.polls_for_stop.enqueue(HOLD + 20)
    other = signal_jobs.runs_for.enqueue(HOLD + 3)
    for job in (poller, other):
        wait_until(
            lambda job=job: _row(other_connection, job.id)[0] == "running",
            message=f"job {job.id} to run",
        )
    leases = {job.id: _row(other_connection, job.id)[1] for job in (poller, other)}

    with transaction.atomic():
        send_signal(poller.id, "stop", {"after": "commit"})
        # The caller stays in its transaction well past STALE_AFTER; meanwhile every
        # sample finds both jobs running under their lease, beaten within STALE_AFTER.
        end = time.monotonic() + HOLD
        while time.monotonic() < end:
            for job_id, lease in leases.items():
                status, now_lease, beat, now = _row(other_connection, job_id)
                assert (status, now_lease) == ("running", lease), f"job {job_id} was reaped"
                assert beat is not None
                late = (now - beat).total_seconds()
                assert late < STALE_AFTER, f"job {job_id}: no heartbeat for {late:.1f}s"
            time.sleep(0.2)

    wait_until(
        lambda: Job.objects.get(id=poller.id).status == "completed",
        timeout=20,
        message="the poller to take the signal",
    )
    done = Job.objects.get(id=poller.id)
    assert done.result == {"stop": {"after": "commit"}}
    assert done.attempts == 1
    wait_until(lambda: Job.objects.get(id=other.id).status == "completed", timeout=20)
    assert Job.objects.get(id=other.id).attempts == 1
