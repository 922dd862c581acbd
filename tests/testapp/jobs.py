"""Sample jobs the tests run (autodiscovered like a user's ``jobs`` module)."""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import connection

from django_pgjobs import JobContext, job


@job
def add(a: int, b: int) -> int:
    return a + b


@job(queue="emails", priority=5, max_attempts=3)
def send_email(to: str, subject: str = "hi") -> dict[str, str]:
    return {"to": to, "subject": subject}


@job
def noop() -> None:
    return None


@job(max_attempts=3)
def always_fails(message: str = "boom") -> None:
    raise ValueError(message)


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


@job(max_attempts=5, discard_on=(Permanent,))
def discard_me() -> None:
    raise Permanent("not worth retrying")


@job(max_attempts=5, retry_on=(Transient,))
def retry_only_transient(kind: str) -> None:
    raise Transient("again") if kind == "transient" else RuntimeError("other")


@job(takes_context=True)
def whoami(context: JobContext) -> dict[str, Any]:
    return {"job_id": context.job_id, "attempt": context.attempt, "lease": context.lease,
            "key": context.idempotency_key}


@job(max_attempts=3)
def flaky_until(marker: str, succeed_on: int) -> int:
    """Fails until it has run ``succeed_on`` times (counted in a file)."""
    with open(marker, "a") as fh:
        fh.write("x")
    with open(marker) as fh:
        runs = len(fh.read())
    if runs < succeed_on:
        raise RuntimeError(f"run {runs} fails")
    return runs


@job(max_attempts=5)
def sleep_then_mark(seconds: float, marker: str) -> str:
    """Sleeps, then appends its pid to ``marker``: counts executions across processes."""
    time.sleep(seconds)
    with open(marker, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    return "slept"


@job(max_attempts=5, atomic=True, takes_context=True)
def atomic_insert(context: JobContext, table: str, seconds: float) -> int:
    """Writes a row, sleeps, then (inside the same transaction) completes."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} (job_id, lease) VALUES (%s, %s)",
                       [context.job_id, context.lease])
    time.sleep(seconds)
    return context.lease


@job(max_attempts=1)
def returns_set() -> Any:
    return {1, 2}


@job(max_attempts=1)
def spins(seconds: float) -> int:
    """A CPU-bound pure-Python loop (holds the GIL between switches)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n
