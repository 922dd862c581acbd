"""The job state machine: the one definition of statuses and the moves between them.

``ALLOWED_TRANSITIONS`` lists every move and the operation that makes it; the
statements that make them live in ``sql.py``. The transition tests
(``tests/test_transitions.py``) are driven from this table, so a statement that
made a move not listed here would fail them.
"""

from __future__ import annotations

from django.db import models

#: Priority bounds; higher runs first (the convention of django.tasks).
PRIORITY_MIN = -100
PRIORITY_MAX = 100


class JobStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    DEAD = "dead", "Dead"
    CANCELLED = "cancelled", "Cancelled"


#: States a job never leaves except through an explicit retry (admin or API).
TERMINAL: frozenset[str] = frozenset({JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED})
#: ``TERMINAL`` in a fixed order, for tables, columns and messages.
FINISHED: tuple[str, ...] = tuple(sorted(str(s) for s in TERMINAL))
#: States with work still to do; ``finished_at`` is NULL exactly in these.
ACTIVE: frozenset[str] = frozenset({JobStatus.PENDING, JobStatus.RUNNING})

#: (from, to) -> the operation that makes that move.
ALLOWED_TRANSITIONS: dict[tuple[str, str], str] = {
    (JobStatus.PENDING, JobStatus.RUNNING): "claim",
    (JobStatus.RUNNING, JobStatus.COMPLETED): "complete",
    (JobStatus.RUNNING, JobStatus.PENDING): "retry / release / reap / admin retry of a stuck job",
    (JobStatus.RUNNING, JobStatus.DEAD): "dead-letter / reap (no attempts left)",
    (JobStatus.PENDING, JobStatus.CANCELLED): "cancel",
    (JobStatus.RUNNING, JobStatus.CANCELLED): "cancel",
    (JobStatus.DEAD, JobStatus.PENDING): "retry (admin/API)",
    (JobStatus.CANCELLED, JobStatus.PENDING): "retry (admin/API)",
}


def can_move(src: str, dst: str) -> bool:
    """Whether the state machine allows ``src -> dst``."""
    return (src, dst) in ALLOWED_TRANSITIONS
