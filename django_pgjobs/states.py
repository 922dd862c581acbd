"""The job state machine: the one definition of statuses and the moves between them.

``ALLOWED_TRANSITIONS`` lists every move and the ways it happens; the statements
that make them live in ``db/``, each declaring its moves (``db/moves.py``). The
transition tests (``tests/db/test_transitions.py``) are driven from this table, so a
statement that made a move not listed here would fail them, and the state diagram
of ``docs/reference/schema.md`` is generated from it (``state_diagram``).
"""

from __future__ import annotations

from django.db import models

#: Priority bounds; higher runs first (the convention of django.tasks).
PRIORITY_MIN = -100
PRIORITY_MAX = 100


class JobStatus(models.TextChoices):
    #: A workflow job waiting for its parents: never claimed; the
    #: completion of its last parent moves it to pending (``db/workflow_trigger.py``).
    BLOCKED = "blocked", "Blocked"
    #: A durable job parked between runs (a sleep, a wait for a signal or an event):
    #: never claimed, holds no worker slot and counts against no limit; the wake pass
    #: (``maintenance/wakes.py``) or a signal moves it back to pending.
    WAITING = "waiting", "Waiting"
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
ACTIVE: frozenset[str] = frozenset(
    {JobStatus.BLOCKED, JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING}
)

# Ways that more than one move names: a cancel, and an explicit retry (admin or API),
# which puts a workflow job back to blocked while its parents are unfinished.
_CANCEL = "cancel"
_RETRY = "retry (admin/API)"
_RETRY_TO_BLOCKED = f"{_RETRY} with parents unfinished"

#: (from, to) -> the ways that move happens, each one edge of the schema page's diagram
#: (``state_diagram``). Every statement that makes a move declares it next to its text
#: (``db/moves.py``); tests/db/test_transitions.py holds the two to each other.
ALLOWED_TRANSITIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (JobStatus.PENDING, JobStatus.RUNNING): ("claim (attempts + 1, lease + 1)",),
    (JobStatus.RUNNING, JobStatus.COMPLETED): ("returned (result stored)",),
    (JobStatus.RUNNING, JobStatus.PENDING): (
        "failed with attempts left (run_at = now + backoff)",
        "released at shutdown (attempt not counted)",
        "reaped, heartbeat stale (attempt given back)",
        "retry of a stuck job (admin/API)",
        "parked, but woken while it parked (attempt not counted)",
    ),
    (JobStatus.RUNNING, JobStatus.DEAD): (
        "failed, no attempts left / discard_on / timed out for good",
        "reaped, its workers lost max_attempts times already",
    ),
    (JobStatus.PENDING, JobStatus.DEAD): (
        "no live worker has known its task for UNKNOWN_TASK_TIMEOUT",
        "its attempts used up while pending (it would fail every claim)",
    ),
    (JobStatus.PENDING, JobStatus.CANCELLED): (_CANCEL,),
    (JobStatus.RUNNING, JobStatus.CANCELLED): ("cancel (lease + 1)",),
    (JobStatus.DEAD, JobStatus.PENDING): (_RETRY,),
    (JobStatus.CANCELLED, JobStatus.PENDING): (_RETRY,),
    # Workflows: moves the database makes in the transaction of a
    # parent's move (the trigger of db/workflow_trigger.py), and retries of a workflow job.
    (JobStatus.BLOCKED, JobStatus.PENDING): ("its last parent finished (same transaction)",),
    (JobStatus.BLOCKED, JobStatus.CANCELLED): (
        "a parent ended dead or cancelled (on_parent_failure=cancel)",
        _CANCEL,
    ),
    (JobStatus.CANCELLED, JobStatus.BLOCKED): (
        "the parent that cancelled it was retried",
        _RETRY_TO_BLOCKED,
    ),
    (JobStatus.DEAD, JobStatus.BLOCKED): (_RETRY_TO_BLOCKED,),
    (JobStatus.PENDING, JobStatus.BLOCKED): (
        "a parent it was released without was retried (not claimed yet)",
    ),
    # Durable jobs (django_pgjobs/durable/): a run parks between its steps.
    (JobStatus.RUNNING, JobStatus.WAITING): ("parked by a sleep or a wait (attempt not counted)",),
    (JobStatus.WAITING, JobStatus.PENDING): ("woken by its time, a signal or an event",),
    (JobStatus.WAITING, JobStatus.CANCELLED): (_CANCEL,),
}


def can_move(src: str, dst: str) -> bool:
    """Whether the state machine allows ``src -> dst``."""
    return (src, dst) in ALLOWED_TRANSITIONS


def state_diagram() -> str:
    """The Mermaid diagram of ``ALLOWED_TRANSITIONS`` that ``docs/reference/schema.md``
    shows (tests/db/test_transitions.py keeps the page equal to it)."""
    lines = [
        "stateDiagram-v2",
        "    [*] --> pending: enqueue",
        "    [*] --> blocked: enqueue of a workflow job with parents",
    ]
    for (src, dst), ways in ALLOWED_TRANSITIONS.items():
        lines += [f"    {src} --> {dst}: {way}" for way in ways]
    sources = {src for src, _ in ALLOWED_TRANSITIONS}
    lines += [f"    {status} --> [*]" for status in JobStatus if status not in sources]
    return "\n".join(lines) + "\n"
