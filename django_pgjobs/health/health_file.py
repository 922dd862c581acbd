"""A worker-local liveness signal for process supervisors (Kubernetes probes, Docker
HEALTHCHECK): ``runjobs --health-file PATH`` touches PATH while the worker's
heartbeat reaches the database; ``python -m django_pgjobs.health PATH`` exits 0 while
PATH is fresh.

Why a file: a probe runs every few seconds in the worker's container, and starting
Django (or opening a database connection) for each would cost more than the check.
The file is touched only when this worker's row in ``django_pgjobs_worker`` was
refreshed within ``STALE_AFTER`` (the heartbeat thread writes it), so a worker whose
heartbeat stalled, or that cannot reach the database, goes stale, exactly as the
reaper would see it; and only while at least one of its job slots is not stuck (a
heartbeat alone says the process lives, not that it still runs jobs: see
``HEALTH_STUCK_AFTER``). While a job holds the GIL (this thread cannot run), the
worker's heartbeat process keeps a fresh file fresh after each beat it makes, for at
most ``HEALTH_STUCK_AFTER`` of the worker's silence (``pulse.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django_pgjobs.support.safetext import printable

logger = logging.getLogger("django_pgjobs")

#: Default age (seconds) past which ``python -m django_pgjobs.health`` reports failure.
DEFAULT_MAX_AGE = 60.0
#: How the file's text starts while the worker runs without its heartbeat process.
DEGRADED = "degraded: "


def check_writable(path: str) -> None:
    """Raise ``OSError`` when ``path`` cannot be written, without touching an existing
    file (a stale one left by a previous run must not look fresh): a worker whose
    health file can never be written would fail its probe for ever, so it says so at
    start instead."""
    existed = os.path.lexists(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.close(fd)
    if not existed:
        os.unlink(path)


class HealthFile(threading.Thread):
    """Touch ``path`` every ``HEARTBEAT_INTERVAL`` while this worker's row is fresh and
    ``stuck()`` (when given) returns None; otherwise leave it to go stale."""

    def __init__(
        self,
        path: str,
        *,
        worker_id: str,
        alias: str,
        stuck: Callable[[], str | None] | None = None,
        degraded: Callable[[], str | None] | None = None,
    ):
        super().__init__(name="pgjobs-health", daemon=True)
        self.path = Path(path)
        self.worker_id = worker_id
        self.alias = alias
        self.stuck = stuck
        self.degraded = degraded  # written into the file: the probe says it
        self._written: str | None = None  # the file's text as last written
        self._stop_event = threading.Event()
        self._said: str | None = None  # the last problem logged (each is logged once)

    def run(self) -> None:
        from django.db import DatabaseError, connections

        from django_pgjobs.conf import get_settings
        from django_pgjobs.db.store import WORKER_FRESH

        conf = get_settings()
        connection = connections[self.alias]
        try:
            while not self._stop_event.is_set():
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(WORKER_FRESH, [conf.STALE_AFTER, self.worker_id])
                        row = cursor.fetchone()
                    if row is not None and row[0]:  # the heartbeat reaches the database
                        problem = self.stuck() if self.stuck is not None else None
                        if problem is None:
                            self._touch()
                        self._say(problem)
                except DatabaseError:
                    connection.close()
                except OSError as exc:  # checked at start; it became unwritable since
                    self._say(f"cannot touch the health file {self.path}: {exc}")
                self._stop_event.wait(conf.HEARTBEAT_INTERVAL)
        finally:
            connection.close()

    def _touch(self) -> None:
        """Touch the file; its text says why the worker is degraded (empty: it is not)."""
        why = self.degraded() if self.degraded is not None else None
        text = f"{DEGRADED}{why}\n" if why else ""
        if text != self._written:
            self.path.write_text(text)
            self._written = text
        else:
            self.path.touch()

    def _say(self, problem: str | None) -> None:
        """Log a problem once when it starts (and once when it ends), not every interval."""
        if problem is not None and problem != self._said:
            logger.warning("health file %s not touched: %s", self.path, problem)
        elif problem is None and self._said is not None:
            logger.warning("health file %s touched again", self.path)
        self._said = problem

    def stop(self) -> None:
        """Stop touching and remove the file: a stopped worker is not alive."""
        self._stop_event.set()
        self.join(timeout=5)
        with contextlib.suppress(OSError):
            self.path.unlink()


def max_age_seconds(text: str) -> float:
    """``--max-age``: a finite number of seconds above 0 (``nan`` would pass every file)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds above 0, such as 60, got {text!r}"
        )
    return value


def probe(path: str, max_age: float) -> tuple[bool, str]:
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return False, f"{path} does not exist (worker not started yet, or stopped)"
    if not age <= max_age:  # also false for a nan limit passed from code
        return False, (
            f"{path} is {age:.0f}s old (limit {max_age:g}s): the worker's "
            "heartbeat is not reaching the database, or every one of its job slots "
            "is stuck (its log says which)"
        )
    try:
        with open(path, errors="replace") as fh:
            text = fh.read(1000).strip()
    except OSError:
        text = ""
    if text.startswith(DEGRADED):  # alive and running jobs, without its heartbeat process
        return True, f"{path} is {age:.1f}s old; {printable(text)}"
    return True, f"{path} is {age:.1f}s old"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m django_pgjobs.health",
        description="Exit 0 while a runjobs --health-file is fresh, 1 otherwise "
        "(2: bad arguments).",
    )
    parser.add_argument("path")
    parser.add_argument(
        "--max-age",
        type=max_age_seconds,
        default=DEFAULT_MAX_AGE,
        help=f"seconds (default {DEFAULT_MAX_AGE:g})",
    )
    options = parser.parse_args(argv)
    ok, message = probe(options.path, options.max_age)
    print(("ok: " if ok else "unhealthy: ") + message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
