"""``manage.py cancel_jobs``: the admin's Cancel action from the shell (fenced, chunked)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from django_pgjobs.jobs import operations
from django_pgjobs.jobs.managers import JobQuerySet
from django_pgjobs.management.selection import CANCEL_STATUSES
from django_pgjobs.management.selection_command import SelectionCommand


class Command(SelectionCommand):
    help = (
        "Cancel blocked, waiting, pending or running jobs (lease bumped: a running job's result is "
        "rejected and its context.is_cancelled() turns true). Needs at least one of "
        "--ids, --task, --queue, --status."
    )
    verb = "cancel"
    done = "Cancelled"
    statuses = CANCEL_STATUSES

    def selection(self, options: dict[str, Any]) -> JobQuerySet:
        if not any(options[k] for k in ("ids", "task", "queue", "status")):
            raise CommandError(
                "cancel_jobs needs --ids, --task, --queue or --status; it "
                "does not cancel every job by default (pass "
                "--status pending,running to mean all)"
            )
        return super().selection(options)

    def eligible(self, qs: JobQuerySet) -> JobQuerySet:
        return qs.cancellable()

    def apply(self, qs: JobQuerySet) -> int:
        return len(operations.cancel(qs))
