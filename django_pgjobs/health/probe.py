"""A worker-local liveness signal for process supervisors (Kubernetes probes, Docker
HEALTHCHECK): ``runjobs --health-file PATH`` touches PATH while the worker's
heartbeat reaches the database; ``python -m django_pgjobs.health PATH`` exits 0 while
PATH is fresh.

Why a file: a probe runs every few seconds in the worker's container, and starting
Django (or opening a database connection) for each would cost more than the check.
The file is touched only when this worker's row in ``django_pgjobs_worker`` was
refreshed within ``STALE_AFTER`` (the heartbeat thread writes it), so a worker whose
heartbeat stalled, or that cannot reach the database, goes stale, exactly as the
reaper would see it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

#: Default age (seconds) past which ``python -m django_pgjobs.health`` reports failure.
DEFAULT_MAX_AGE = 60.0


class HealthFile(threading.Thread):
    """Touch ``path`` every ``HEARTBEAT_INTERVAL`` while this worker's row is fresh."""

    def __init__(self, path: str, *, worker_id: str, alias: str):
        super().__init__(name="pgjobs-health", daemon=True)
        self.path = Path(path)
        self.worker_id = worker_id
        self.alias = alias
        self._stop_event = threading.Event()

    def run(self) -> None:
        from django.db import DatabaseError, connections

        from django_pgjobs import sql
        from django_pgjobs.conf import get_settings

        conf = get_settings()
        connection = connections[self.alias]
        query = (
            f"SELECT last_seen > now() - make_interval(secs => %s) FROM {sql.WORKER} WHERE id = %s"  # noqa: S608 - a table-name constant; values are parameters
        )
        try:
            while not self._stop_event.is_set():
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(query, [conf.STALE_AFTER, self.worker_id])
                        row = cursor.fetchone()
                    if row is not None and row[0]:
                        self.path.touch()
                except DatabaseError:
                    connection.close()
                except OSError:
                    pass  # an unwritable path: the probe will say the file is missing
                self._stop_event.wait(conf.HEARTBEAT_INTERVAL)
        finally:
            connection.close()

    def stop(self) -> None:
        """Stop touching and remove the file: a stopped worker is not alive."""
        self._stop_event.set()
        self.join(timeout=5)
        with contextlib.suppress(OSError):
            self.path.unlink()


def probe(path: str, max_age: float) -> tuple[bool, str]:
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return False, f"{path} does not exist (worker not started yet, or stopped)"
    if age > max_age:
        return False, (
            f"{path} is {age:.0f}s old (limit {max_age:g}s): the worker's "
            "heartbeat is not reaching the database"
        )
    return True, f"{path} is {age:.1f}s old"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m django_pgjobs.health",
        description="Exit 0 while a runjobs --health-file is fresh, 1 otherwise.",
    )
    parser.add_argument("path")
    parser.add_argument(
        "--max-age",
        type=float,
        default=DEFAULT_MAX_AGE,
        help=f"seconds (default {DEFAULT_MAX_AGE:g})",
    )
    options = parser.parse_args(argv)
    ok, message = probe(options.path, options.max_age)
    print(("ok: " if ok else "unhealthy: ") + message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
