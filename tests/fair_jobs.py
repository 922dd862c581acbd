"""Jobs of the fair-share tests (tests/db/test_fair.py, tests/process/test_fair_process.py):
workers load them only with PGJOBS_TEST_FAIR=1 (tests/settings.py). Each returns its
start time, so a test reads the order jobs started in across workers."""

from __future__ import annotations

import time

from django_pgjobs import job


@job(queue="fair", fair_key="tenant:{tenant}")
def tenant_job(tenant: str, i: int, seconds: float = 0.0) -> dict[str, float]:
    start = time.time()
    time.sleep(seconds)
    return {"start": start, "end": time.time()}


def _tenant_of(payload: dict[str, str]) -> str:
    return payload["tenant"]


@job(queue="fair", fair_key=_tenant_of)
def by_payload(payload: dict[str, str]) -> None:
    return None


@job(queue="fair")
def unkeyed(i: int) -> None:
    return None


@job(queue="unfair")
def unfair_tenant_job(tenant: str, i: int, seconds: float = 0.0) -> dict[str, float]:
    """``tenant_job`` without a fair key: the benchmark's FIFO baseline."""
    start = time.time()
    time.sleep(seconds)
    return {"start": start, "end": time.time()}
