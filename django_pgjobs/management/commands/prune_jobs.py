"""``manage.py prune_jobs``: delete finished jobs older than their retention, in small batches."""

from __future__ import annotations

import re
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgjobs.conf import get_settings
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.management.autocommit import require_autocommit
from django_pgjobs.management.selection import positive_int, status_list
from django_pgjobs.states import FINISHED

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def duration(value: str) -> float:
    """``90`` / ``90s`` / ``30m`` / ``12h`` / ``7d`` / ``2w`` -> seconds."""
    match = DURATION_RE.match(value)
    if not match:
        raise ArgumentTypeError(
            f"expected a duration such as 7d, 12h, 30m, 90s or a number of seconds, got {value!r}"
        )
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ArgumentTypeError(f"must be a positive duration, got {value!r}")
    return seconds


class Command(BaseCommand):
    help = (
        "Delete finished jobs older than PGJOBS RETENTION (per status), and events older "
        "than EVENT_RETENTION, in small batches that hold row locks for milliseconds; safe "
        "on many hosts at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=duration,
            help="override the retention for the chosen statuses (7d, 12h, 30m, 90s)",
        )
        parser.add_argument(
            "--status",
            type=status_list(FINISHED, "a finished status"),
            help="comma-separated finished statuses to prune (default: every "
            "status whose RETENTION is not None)",
        )
        parser.add_argument(
            "--batch",
            type=positive_int,
            default=1000,
            help="rows deleted per statement (default 1000)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="only count what would be deleted"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_autocommit("prune_jobs")
        retention = dict(get_settings().RETENTION)
        statuses = options["status"]
        if options["older_than"] is not None:
            # Explicitly named statuses are pruned even when their RETENTION is None.
            for status in statuses or [s for s in FINISHED if retention.get(s) is not None]:
                retention[status] = options["older_than"]
        pruner = Pruner(retention=retention, batch=options["batch"])
        plan = pruner.plan(statuses)
        if not plan:
            raise CommandError(
                "nothing to prune: the chosen statuses have RETENTION None "
                "(keep forever); pass --status and --older-than to prune them"
            )
        if options["dry_run"]:
            counts = pruner.count(statuses)
            for status, older_than in plan:
                self.stdout.write(
                    f"would delete {counts[status]} {status} job(s) finished "
                    f"more than {older_than:g}s ago"
                )
            if statuses is None and pruner.event_retention is not None:
                self.stdout.write(
                    f"would delete {pruner.count_events()} event(s) older than "
                    f"{pruner.event_retention:g}s"
                )
            return
        result = pruner.run_once(statuses)
        for status, older_than in plan:
            self.stdout.write(
                f"deleted {result['by_status'].get(status, 0)} {status} job(s) "
                f"finished more than {older_than:g}s ago"
            )
        if statuses is None and pruner.event_retention is not None:
            self.stdout.write(
                f"deleted {result['events']} event(s) older than {pruner.event_retention:g}s"
            )
        self.stdout.write(
            f"{result['deleted']} in {len(result['batches'])} batch(es) of at most {pruner.batch}"
        )
