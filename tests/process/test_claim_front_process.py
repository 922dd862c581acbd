"""The claim front in a real ``runjobs`` process (the in-process tests of the front:
tests/db/test_claim_front.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_pgjobs.models import Job
from tests.conftest import wait_until
from tests.testapp import jobs


@pytest.mark.process
def test_a_worker_with_use_tz_off_runs_a_stream_of_jobs(start_worker: Any) -> None:
    """The same rule in a real ``runjobs`` under ``USE_TZ = False``: jobs enqueued one
    by one (each NOTIFY may land during a claim) all run, and neither the listen
    connection nor the claim loop fails (both compared naive with aware times: the
    listen connection reconnected after each, a claim's rows waited for the reaper)."""
    worker = start_worker(
        "--concurrency", "2", env={"DJANGO_SETTINGS_MODULE": "tests.settings_no_tz"}
    )
    first = jobs.noop.enqueue().id
    wait_until(
        lambda: Job.objects.get(id=first).status == "completed", timeout=30, message="worker up"
    )
    ids = []
    for _ in range(150):
        ids.append(jobs.noop.enqueue().id)
        time.sleep(0.01)
    wait_until(
        lambda: Job.objects.filter(id__in=ids, status="completed").count() == len(ids),
        timeout=30,
        message="every job of the stream completed",
    )
    worker.signal(15)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert "unexpected error in the claim loop" not in worker.output(), worker.output()
    assert "error on the listen connection" not in worker.output(), worker.output()
    assert "Traceback" not in worker.output(), worker.output()
