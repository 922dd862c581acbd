"""The flow-control test job with a concurrency key: workers load it only with
PGJOBS_TEST_KEYED=1 (tests/settings.py), as a worker that knows a keyed task takes
the limited claim for everything it claims."""

from __future__ import annotations

from django_pgjobs import job
from tests.flow_jobs import timed


@job(queue="flow-keyed", concurrency_key="user:{user_id}", concurrency_limit=1)
def per_user(user_id: int, i: int, seconds: float) -> dict[str, float]:
    return timed(seconds)


def _account_key(payload: dict[str, str]) -> str:
    return f"acct-{payload['account']}"


@job(queue="flow-keyed", concurrency_key=_account_key, concurrency_limit=3)
def by_account(payload: dict[str, str]) -> None:
    return None
