"""``manage.py jobs_status``: per queue and status counts, lag, stuck jobs, workers, table health."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from django_pgjobs import status
from django_pgjobs.management.commands.prune_jobs import duration


class Command(BaseCommand):
    help = ("Show per queue: pending, due, running, stuck, lag (age of the oldest due job), "
            "live workers and recently finished jobs; and the jobs table's vacuum health. "
            "Cheap on tables with millions of finished rows (no counts over history).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--window", type=duration, default=3600.0,
                            help="how far back finished jobs are counted (default 1h)")

    def handle(self, *args: Any, **options: Any) -> None:
        result = status.collect(window=options["window"])
        if options["json"]:
            self.stdout.write(status.to_json(result))
        else:
            self.stdout.write(status.render(result, timezone.now()), ending="")
