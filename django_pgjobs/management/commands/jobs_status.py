"""``manage.py jobs_status``: per queue and status counts, lag, stuck jobs, workers, table health."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from django.utils import timezone

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness
from django_pgjobs.health import status
from django_pgjobs.management.commands.prune_jobs import duration


class Command(BaseCommand):
    help = (
        "Show per queue: pending, due, running, stuck, lag (age of the oldest due job), "
        "live workers and recently finished jobs; and the jobs table's vacuum health. "
        "Cheap on tables with millions of finished rows (no counts over history)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument(
            "--window",
            type=duration,
            default=3600.0,
            help="how far back finished jobs are counted (default 1h)",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="exit 1 when a warning is printed (stuck jobs, due work with "
            "no live worker, autovacuum off, dead-tuple bloat), 2 when "
            "the database is not ready; for cron jobs and probes",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = status.collect(window=options["window"])
        except DatabaseError as exc:
            explained = readiness.explain(exc, get_settings().DATABASE)
            if not explained:
                raise
            if options["check"]:
                self.stderr.write(f"jobs_status: {explained}")
                sys.exit(2)
            raise CommandError(explained) from exc
        if options["json"]:
            self.stdout.write(status.to_json(result))
        else:
            self.stdout.write(status.render(result, timezone.now()), ending="")
        if options["check"] and result.warnings:
            self.stderr.write(f"jobs_status --check: {len(result.warnings)} warning(s)")
            sys.exit(1)
