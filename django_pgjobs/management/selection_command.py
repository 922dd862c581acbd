"""What ``retry_jobs`` and ``cancel_jobs`` are: select jobs by the options
(``selection.py``), then show them (``--dry-run``) or change them with the fenced,
chunked operation (``jobs/operations.py``, the admin's actions too) and say how many."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness
from django_pgjobs.jobs.managers import JobQuerySet
from django_pgjobs.management.autocommit import require_autocommit
from django_pgjobs.management.selection import add_selection_arguments, selected_jobs

#: Ids listed by --dry-run before "and N more".
SHOWN = 20


class SelectionCommand(BaseCommand):
    """Select jobs by id/task/queue/status, then change them with one fenced operation."""

    verb = ""  # "retry" / "cancel"
    done = ""  # "Retried" / "Cancelled"
    statuses: tuple[str, ...] = ()
    default_status: tuple[str, ...] = ()  # () means every status of ``statuses``

    def add_arguments(self, parser: CommandParser) -> None:
        add_selection_arguments(parser, self.statuses, self.default_status or self.statuses)

    def selection(self, options: dict[str, Any]) -> JobQuerySet:
        return selected_jobs(options, self.default_status or self.statuses)

    def eligible(self, qs: JobQuerySet) -> JobQuerySet:
        """The selected jobs the operation would change (for ``--dry-run``)."""
        raise NotImplementedError

    def apply(self, qs: JobQuerySet) -> int:
        """Change the selected jobs; return how many changed."""
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        require_autocommit(f"{self.verb}_jobs")
        try:
            self._handle(options)
        except DatabaseError as exc:
            explained = readiness.explain(exc, get_settings().DATABASE)
            if explained:
                raise CommandError(explained) from exc
            raise

    def _handle(self, options: dict[str, Any]) -> None:
        qs = self.selection(options)
        if options["dry_run"]:
            ids = list(self.eligible(qs).order_by("id").values_list("id", flat=True)[: SHOWN + 1])
            count = self.eligible(qs).count()
            shown = ", ".join(f"#{i}" for i in ids[:SHOWN])
            more = f" and {count - SHOWN} more" if count > SHOWN else ""
            self.stdout.write(
                f"Would {self.verb} {count} job{'s' if count != 1 else ''}"
                + (f": {shown}{more}" if count else "")
                + " (dry run: nothing changed)."
            )
            return
        self.report(self.apply(qs))

    def report(self, changed: int) -> None:
        self.stdout.write(f"{self.done} {changed} job{'s' if changed != 1 else ''}.")
