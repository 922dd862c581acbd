"""Jobs for the worker's error-path, timeout and async tests (tests/faults/test_worker_errors.py,
tests/test_async_jobs.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django_pgjobs import JobContext, job


class ExitingStr(Exception):
    """An exception whose ``__str__`` raises SystemExit."""

    def __str__(self) -> str:
        raise SystemExit("str of this exception exits")


@job(max_attempts=2)
def hostile(kind: str) -> Any:
    """Values and exceptions that used to break the worker's own threads."""
    if kind == "deep":
        value: list[Any] = []
        for _ in range(5000):
            value = [value]
        return value
    if kind == "exiting_str":
        raise ExitingStr
    if kind == "huge_int":
        return 10**5000
    if kind == "big":
        return "x" * 200
    return "ok"


@job(max_attempts=2, timeout=1)
def sleeps_past_timeout(seconds: float = 5.0) -> str:
    time.sleep(seconds)
    return "finished late"


@job(max_attempts=1, takes_context=True)
def watches_cancel(context: JobContext, seconds: float = 10.0) -> bool:
    """Sleeps until the worker gives up on it; returns whether it saw the cancel."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if context.is_cancelled():
            return True
        time.sleep(0.02)
    return False


@job(max_attempts=1)
async def async_sleep(seconds: float = 0.05) -> list[float]:
    """Returns when it really ran: [start, end] (epoch seconds)."""
    start = time.time()
    await asyncio.sleep(seconds)
    return [start, time.time()]


@job(max_attempts=1, timeout=0.5)
async def async_past_timeout(seconds: float = 30.0) -> None:
    await asyncio.sleep(seconds)


@job(max_attempts=1)
async def async_orm_count() -> int:
    from django_pgjobs.models import Job

    return await Job.objects.acount()


@job(max_attempts=1)
def nap(seconds: float) -> None:
    """A slow job for the fairness test."""
    time.sleep(seconds)
