"""``manage.py retry_jobs``: the admin's Retry action from the shell (fenced, chunked)."""

from __future__ import annotations

from typing import Any

from django_pgjobs.management.selection import RETRY_STATUSES, SelectionCommand


class Command(SelectionCommand):
    help = ("Put dead (default), cancelled or stuck running jobs back to pending, due now, "
            "attempts reset, lease bumped. Running jobs are retried only when their "
            "heartbeat is stale.")
    verb = "retry"
    done = "Retried"
    statuses = RETRY_STATUSES
    default_status = ["dead"]

    def eligible(self, qs: Any) -> Any:
        return qs.retryable()

    def apply(self, qs: Any) -> int:
        return int(qs.retry())
