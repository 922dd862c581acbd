"""Reconnect backoff with rate-limited logging, shared by every worker thread.

The delay is the retries' formula (``retry.backoff``, full jitter): one backoff in
the package, from 0.1 s doubling up to 10 s.
"""

from __future__ import annotations

import logging
import time

from django_pgjobs.support.retry import backoff

logger = logging.getLogger("django_pgjobs")


class Backoff:
    """Exponential backoff with full jitter (0.1 s .. 10 s) and at most one log line per 10 s."""

    def __init__(self, what: str, *, first: float = 0.1, cap: float = 10.0):
        self.what = what
        self.first = first
        self.cap = cap
        self.failures = 0
        self._last_log = 0.0
        self._suppressed = 0

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._last_log >= 10.0 or self.failures == 1:
            more = f" ({self._suppressed} similar errors suppressed)" if self._suppressed else ""
            logger.warning(
                "database error on the %s (failure %d, retrying): %s%s",
                self.what,
                self.failures,
                exc,
                more,
            )
            self._last_log = now
            self._suppressed = 0
        else:
            self._suppressed += 1

    def succeeded(self) -> None:
        if self.failures:
            logger.info("%s recovered after %d failed attempts", self.what, self.failures)
        self.failures = 0

    def delay(self) -> float:
        """Seconds to wait before the next try: ``uniform(0, min(cap, first * 2**(n-1)))``
        after the n-th failure in a row."""
        return backoff(self.failures, base=self.first, cap=self.cap)
