"""``manage.py reap_jobs``: reclaim stuck jobs once, or forever with ``--loop``."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, connections

from django_pgjobs.conf import get_settings
from django_pgjobs.maintenance.reaper import Reaper
from django_pgjobs.management.autocommit import require_autocommit
from django_pgjobs.management.selection import positive_float
from django_pgjobs.support.throttle import Backoff


class Command(BaseCommand):
    help = "Reclaim running jobs whose heartbeat is older than STALE_AFTER."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop",
            action="store_true",
            help="keep reaping every REAPER_INTERVAL until interrupted",
        )
        parser.add_argument(
            "--stale-after",
            type=positive_float,
            default=None,
            help="seconds without heartbeat before a job is reclaimed (default PGJOBS STALE_AFTER)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_autocommit("reap_jobs")
        reaper = Reaper(stale_after=options["stale_after"])
        if not options["loop"]:
            counts = reaper.run_once()
            self.stdout.write(self._describe(counts))
            return
        backoff = Backoff("reaper connection")
        try:
            while True:
                try:
                    counts = reaper.run_once()
                    backoff.succeeded()
                    if counts["reaped"]:
                        self.stdout.write(self._describe(counts))
                    time.sleep(reaper.interval)
                except DatabaseError as exc:
                    backoff.failed(exc)
                    connections[get_settings().DATABASE].close()
                    time.sleep(backoff.delay())
        except KeyboardInterrupt:
            return

    @staticmethod
    def _describe(counts: dict[str, Any]) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()) if k != "reaped")
        return f"reaped {counts['reaped']} job(s)" + (f" ({parts})" if parts else "")
