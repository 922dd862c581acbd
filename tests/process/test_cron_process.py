"""Built-in cron across real runjobs processes: one job per fire time, none missed."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from django_pgjobs.models import Job
from tests.conftest import wait_until

pytestmark = pytest.mark.process

KEY_PREFIX = "cron:every-second:"


def fire_times() -> list[datetime]:
    keys = Job.objects.filter(idempotency_key__startswith=KEY_PREFIX).values_list(
        "idempotency_key", flat=True
    )
    return sorted(
        datetime.fromisoformat(k.removeprefix(KEY_PREFIX).replace("Z", "+00:00")) for k in keys
    )


def test_three_replicas_make_exactly_one_job_per_fire_time(start_worker: Any) -> None:
    env = {"DJANGO_SETTINGS_MODULE": "tests.cron_settings"}
    workers = [start_worker("--concurrency", "2", env=env) for _ in range(3)]
    # Every replica ticks twice a second on a per-second schedule; let 5 fire times pass.
    wait_until(lambda: len(fire_times()) >= 6, timeout=30, message="6 fire times enqueued")
    for worker in workers:
        worker.signal(15)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker.output()
    times = fire_times()
    # No fire time missed between the first and the last, and each one exactly once.
    assert times == [times[0] + timedelta(seconds=i) for i in range(len(times))]
    assert Job.objects.filter(idempotency_key__startswith=KEY_PREFIX).count() == len(times)
    # The replicas lost races without any error surfacing, and workers ran the jobs.
    for worker in workers:
        output = worker.output()
        assert "duplicate key" not in output and "Traceback" not in output, output
    assert Job.objects.filter(status="completed").count() >= len(times) - 2
    assert {j.result for j in Job.objects.filter(status="completed")} == {42}
