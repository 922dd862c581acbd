"""Deploy skew, the maintenance pass: dead-letter a job only when no live worker has known
its task for ``UNKNOWN_TASK_TIMEOUT`` — a task that was removed from the code, or a
``@job`` that no worker ever imports.

During a rolling deploy new web code can enqueue a task that the still-old workers do
not have. Workers claim only the tasks they know (``Worker.tasks``, the
``JOB_CLAIM_*_KNOWN`` claims), so such jobs simply wait; ``jobs_status`` and the admin
show them (``db.store.unknown_pending``, ``live_tasks``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db import store
from django_pgjobs.exceptions import UnknownTask
from django_pgjobs.jobs.registry import DISCOVERY_HINT
from django_pgjobs.support.error_entries import exception_type

logger = logging.getLogger("django_pgjobs")


def unknown_message(timeout: float) -> str:
    """A format() pattern for PostgreSQL: %L becomes the quoted task name."""
    return (
        f"unknown task %L: no live worker has known it for {timeout:g}s "
        f"(UNKNOWN_TASK_TIMEOUT). {DISCOVERY_HINT}."
    )


class UnknownTaskSweeper:
    """Maintenance service: keep ``KnownTask`` fresh and dead-letter jobs whose task
    no live worker has known for ``UNKNOWN_TASK_TIMEOUT``."""

    name = "unknown-tasks"

    def __init__(self, *, alias: str, batch: int = 500):
        conf = get_settings()
        self.alias = alias
        self.batch = batch
        self.timeout = conf.UNKNOWN_TASK_TIMEOUT
        self.stale_after = conf.STALE_AFTER
        self.interval = max(0.5, min(60.0, self.timeout / 4))

    def run_once(self) -> dict[str, Any]:
        with connections[self.alias].cursor() as cursor:
            store.known_tasks_touch(cursor, stale_after=self.stale_after, every=self.interval / 2)
            dead = store.job_dead_unknown(
                cursor,
                {
                    "timeout": self.timeout,
                    "stale_after": self.stale_after,
                    "batch": self.batch,
                    "type": exception_type(UnknownTask),
                    "message": unknown_message(self.timeout),
                },
            )
        for job_id, task in dead:
            logger.error(
                "job %s dead-lettered: unknown task %r (no live worker has known it for %gs). %s",
                job_id,
                task,
                self.timeout,
                DISCOVERY_HINT,
                extra={"job_id": job_id, "task": task},
            )
        return {"dead": len(dead)}
