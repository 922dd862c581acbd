"""``manage.py sync_cron``: list recurring schedules; ``--pg-cron`` installs them in pg_cron."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgjobs.conf import get_settings
from django_pgjobs.maintenance import pg_cron_engine
from django_pgjobs.maintenance.cron import ScheduleError, load_schedules
from django_pgjobs.management.autocommit import require_autocommit

#: The on/off options by destination, with their help: --pg-cron, and those that only
#: mean something with it (``handle`` refuses them without it).
SWITCHES = {
    "pg_cron": "make pg_cron's cron.job entries pgjobs:* match the schedules",
    "maintenance": "with --pg-cron: also run the reaper and pruner from pg_cron "
    "every minute (pgjobs:_reap, pgjobs:_prune)",
    "uninstall": "with --pg-cron: remove every pgjobs:* entry of this database",
    "dry_run": "with --pg-cron: show what would change, change nothing",
}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


class Command(BaseCommand):
    help = (
        "List recurring schedules with their next fire times. With --pg-cron, install, "
        "update and remove the matching pg_cron entries (pgjobs:<name>) idempotently."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        for dest, text in SWITCHES.items():
            parser.add_argument(_flag(dest), action="store_true", help=text)
        parser.add_argument(
            "--count",
            type=int,
            default=1,
            choices=range(1, 11),
            metavar="N",
            help="how many next fire times to list (1-10)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_autocommit("sync_cron")
        try:
            schedules = load_schedules()
        except ScheduleError as exc:
            raise CommandError(str(exc)) from None
        if not options["pg_cron"]:
            for dest in SWITCHES:  # pg_cron itself is off here
                if options[dest]:
                    raise CommandError(f"{_flag(dest)} needs --pg-cron")
            self._list(schedules, options["count"])
            return
        try:
            location, changes = pg_cron_engine.sync(
                schedules,
                maintenance=options["maintenance"],
                uninstall=options["uninstall"],
                dry_run=options["dry_run"],
            )
        except pg_cron_engine.PgCronError as exc:
            raise CommandError(str(exc)) from None
        where = (
            "this database"
            if location.same_database
            else f"database {location.cron_database!r}, running in {location.app_database!r}"
        )
        self.stdout.write(
            f"pg_cron {location.version} in {where}"
            + (" (dry run: nothing changed)" if options["dry_run"] else "")
        )
        for change in changes:
            self.stdout.write(f"  {change.action:9}  {change.jobname}  [{change.schedule}]")
        if not changes:
            self.stdout.write("  no schedules and no pgjobs:* entries")
        if get_settings().CRON_ENGINE == "builtin" and schedules and not options["uninstall"]:
            self.stdout.write(
                "note: PGJOBS['CRON_ENGINE'] is 'builtin', so runjobs processes enqueue these "
                "schedules too (both engines use the same idempotency keys: still one job per "
                "fire time). Set CRON_ENGINE = 'pg_cron' to leave them to pg_cron."
            )

    def _list(self, schedules: list[Any], count: int) -> None:
        if not schedules:
            self.stdout.write("no recurring schedules (use @job(cron=...) or PGJOBS['CRON'])")
            return
        now = datetime.now(UTC)
        engine = get_settings().CRON_ENGINE
        self.stdout.write(f"engine: {engine}")
        for s in schedules:
            nexts = ", ".join(t.astimezone(s.zone).isoformat() for t in s.upcoming(now, count))
            args = f" args={s.args}" if s.args else ""
            kwargs = f" kwargs={s.kwargs}" if s.kwargs else ""
            self.stdout.write(
                f"{s.name}  [{s.expression}{'' if s.timezone == 'UTC' else ' ' + s.timezone}]  "
                f"task={s.task} queue={s.queue} priority={s.priority}{args}{kwargs}  "
                f"({s.source})\n  next: {nexts}"
            )
