"""``manage.py pause_queue NAME...``: stop every worker from claiming from these queues."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgjobs.management.autocommit import require_autocommit
from django_pgjobs.queues import check_alias, pause_queue, resume_queue


class Command(BaseCommand):
    help = (
        "Pause queues: no worker claims from them (at once with LISTEN, else within "
        "POLL_INTERVAL); running jobs finish and enqueueing still works."
    )
    pause = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="+", metavar="NAME", help="queue names")
        parser.add_argument(
            "--database", default=None, help="database alias (default: PGJOBS['DATABASE'])"
        )
        parser.add_argument(
            "--create",
            action="store_true",
            help="accept a queue nothing knows yet (no @job, setting, queue row or job "
            "names it); without it such a name is refused as a likely typo",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        change = pause_queue if self.pause else resume_queue
        if options["database"] is not None:
            try:
                check_alias(options["database"], "--database")
            except ValueError as exc:
                raise CommandError(str(exc), returncode=2) from None
        require_autocommit("pause_queue" if self.pause else "resume_queue", options["database"])
        try:
            names = change(*options["names"], using=options["database"], create=options["create"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        verb = "paused" if self.pause else "resumed"
        for name in names:
            self.stdout.write(f"{verb} queue {name}")
