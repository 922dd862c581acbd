"""The flow-control test job with a concurrency key: workers load it only with
PGJOBS_TEST_KEYED=1 (tests/settings.py), as a worker that knows a keyed task takes
the limited claim for everything it claims."""

from __future__ import annotations

import asyncio
import time

from django_pgjobs import JobContext, job
from tests.flow_jobs import timed
from tests.helpers import run_records


@job(queue="flow-keyed", concurrency_key="user:{user_id}", concurrency_limit=1)
def per_user(user_id: int, i: int, seconds: float) -> dict[str, float]:
    return timed(seconds)


def _account_key(payload: dict[str, str]) -> str:
    return f"acct-{payload['account']}"


@job(queue="flow-keyed", concurrency_key=_account_key, concurrency_limit=3)
def by_account(payload: dict[str, str]) -> None:
    return None


@job(concurrency_key="wf:{group}", concurrency_limit=1)
def keyed_step(group: str, seconds: float = 0.0) -> dict[str, float]:
    """A workflow node with a concurrency key (tests/db/test_workflows.py)."""
    return timed(seconds)


@job(queue="slots-keyed", concurrency_key="slots:{key}", concurrency_limit=1, takes_context=True)
def keyed_sleeper(context: JobContext, key: str, seconds: float) -> None:
    """Limit 1 per key; records its runs (tests/helpers/run_records.py). Timeouts per call."""
    run_records.recorded(context, f"slots:{key}", seconds)


@job(max_attempts=3, timeout=30, concurrency_key="neighbour:{key}", concurrency_limit=1)
async def async_keyed_sleep(key: str, seconds: float) -> list[float]:
    """An async neighbour with a timeout and a concurrency key
    (tests/process/test_async_cancel_all.py)."""
    start = time.time()
    await asyncio.sleep(seconds)
    return [start, time.time()]


@job(queue="fair-limited", fair_key="tenant:{tenant}", concurrency_key="c:{tenant}")
def limited_tenant_job(tenant: str, i: int, seconds: float = 0.0) -> dict[str, float]:
    return timed(seconds)


@job(
    takes_context=True,
    queue="flow-keyed",
    concurrency_key="sleeper:{user_id}",
    concurrency_limit=1,
)
def durable_keyed_sleeper(context: JobContext, user_id: int, seconds: float) -> str:
    """A durable job under a concurrency key of limit 1: while it sleeps (waiting) the
    key's one slot is free."""
    context.sleep("nap", seconds)
    return "woke"
