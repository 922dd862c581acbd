"""Shared helpers: run due jobs in this process until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django_pgjobs.testing import run_jobs


def drain(until: Callable[[], Any] | None = None, timeout: float = 10.0) -> None:
    """Run due jobs (retries become due after a short backoff) until ``until()`` holds,
    or until nothing is left to run when no condition is given."""
    deadline = time.monotonic() + timeout
    while True:
        ran = run_jobs()
        if until is None and not ran:
            return
        if until is not None and until():
            return
        if time.monotonic() > deadline:
            raise AssertionError("timed out draining jobs")
        if not ran:
            time.sleep(0.02)
