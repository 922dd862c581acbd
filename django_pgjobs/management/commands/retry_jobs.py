"""``manage.py retry_jobs``: the admin's Retry action from the shell (fenced, chunked)."""

from __future__ import annotations

from django_pgjobs.jobs import operations
from django_pgjobs.jobs.managers import JobQuerySet
from django_pgjobs.management.selection import RETRY_STATUSES
from django_pgjobs.management.selection_command import SelectionCommand


class Command(SelectionCommand):
    help = (
        "Put dead (default), cancelled or stuck running jobs back to pending, due now, "
        "attempts reset, lease bumped. Running jobs are retried only when their "
        "heartbeat is stale."
    )
    verb = "retry"
    done = "Retried"
    statuses = RETRY_STATUSES
    default_status = ("dead",)
    held: dict[int, int] = {}

    def eligible(self, qs: JobQuerySet) -> JobQuerySet:
        return qs.retryable()

    def apply(self, qs: JobQuerySet) -> int:
        result = operations.retry(qs)
        self.held = result.held
        return len(result.changed)

    def report(self, changed: int) -> None:
        super().report(changed)
        if self.held:
            detail = ", ".join(f"#{i} (held by #{h})" for i, h in sorted(self.held.items()))
            n = len(self.held)
            self.stdout.write(
                f"Skipped {n} job{'s' if n != 1 else ''} whose unique key is held "
                f"by another pending or running job: {detail}."
            )
