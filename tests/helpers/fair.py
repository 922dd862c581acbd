"""Fair-share jobs enqueued in bulk, for the fair claim's tests."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from tests import fair_jobs

FAIR_TASKS = [
    fair_jobs.tenant_job.name,
    fair_jobs.by_payload.name,
    fair_jobs.unkeyed.name,
]


def many(tenant: str, count: int) -> None:
    """``count`` jobs of ``tenant`` in one COPY, due now (a COPY's default run_at is
    the statement's time, later than this test transaction's now())."""
    past = timezone.now() - timedelta(seconds=1)
    fair_jobs.tenant_job.using(run_at=past).enqueue_many([(tenant, i) for i in range(count)])
