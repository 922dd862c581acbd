"""The model-based test's fairness check (tests/model/checks.py) on made-up records:
it holds the fair claim to its promise, the order of its claims, and no more.

A light tenant's job claimed in its turn by a worker then lost (frozen, killed, or
holding the GIL past STALE_AFTER) leaves no run record of that claim: its first
recorded claim is the reclaim after the reaper gave it back, which may come after
the heavy tenant's backlog. The reaper's entry on its row says so, and the check
leaves it out; a light job claimed late without ever being lost is still reported.
"""

from __future__ import annotations

from types import SimpleNamespace

from django_pgjobs.models import Job
from tests.model.checks import fairness
from tests.model.plan import FAIR, HEAVY
from tests.model.records import Run
from tests.model.world import Note

LOST = {"type": "django_pgjobs.exceptions.WorkerLost", "message": "worker lost", "refunded": True}


def _burst(late_light_errors: list[dict[str, object]]) -> list[str]:
    """Eight heavy jobs claimed at 1..8 s, tenant m's at 1.5 s, tenant n's first run
    at 8.01 s (with ``late_light_errors`` on its row)."""
    notes = {i: Note(i, FAIR, i, 0, 0.2, None, None, HEAVY) for i in range(1, 9)}
    notes[9] = Note(9, FAIR, 9, 0, 0.2, None, None, "m")
    notes[10] = Note(10, FAIR, 10, 0, 0.2, None, None, "n")
    claimed = {i: float(i) for i in range(1, 9)} | {9: 1.5, 10: 8.01}
    runs = [
        Run(i, 1, FAIR, None, "model-capped", 100, "w", at, at, at + 0.2, True)
        for i, at in claimed.items()
    ]
    rows = {i: Job(id=i, errors=[]) for i in notes}
    rows[10].errors = late_light_errors
    world = SimpleNamespace(notes=notes)
    return fairness(world, runs, rows)  # type: ignore[arg-type]  # only .notes is read


def test_a_light_job_lost_with_its_worker_is_left_out() -> None:
    assert _burst([LOST]) == []


def test_a_light_job_claimed_after_the_backlog_is_still_reported() -> None:
    problems = _burst([])
    assert len(problems) == 1 and "job 10 first claimed 0.01s after the last job" in problems[0]
