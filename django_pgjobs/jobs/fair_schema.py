"""The columns of fair shares: a job's fair key and the index the fair claim reads
(``claim/fair.py``), a queue's weights, and the check of a weights mapping (the
setting's and the admin's form's; not a field validator, which a migration would
import).

The index is partial on keyed pending jobs: a project that never sets a fair key
keeps it empty, so its enqueues and claims pay nothing for it.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q

from django_pgjobs.states import JobStatus

#: Highest weight of a fair key.
MAX_WEIGHT = 1000

#: The fair claim's index: one range per (queue, key), in claim order within it.
FAIR_INDEX = models.Index(
    "queue",
    "fair_key",
    models.F("priority").desc(),
    "run_at",
    "id",
    name="pgjobs_job_fair_idx",
    condition=Q(status=JobStatus.PENDING, fair_key__isnull=False),
)


def fair_key_field() -> models.CharField[Any, Any]:
    """``Job.fair_key``: computed at enqueue from ``@job(fair_key=...)``."""
    return models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="the key whose jobs share the queue's claims fairly with other keys",
    )


def weights_problems(value: Any, where: str = "weights") -> list[str]:
    """Everything wrong with a weights mapping (fair key -> whole number 1..MAX_WEIGHT)."""
    if value is None:
        return []
    if not isinstance(value, dict):
        return [f"{where} must be a dict of fair key -> weight, got {type(value).__name__}"]
    problems = []
    for key, weight in value.items():
        if not isinstance(key, str) or not 1 <= len(key) <= 255:
            problems.append(f"{where} has a key that is not a fair key (1-255 characters): {key!r}")
        elif isinstance(weight, bool) or not isinstance(weight, int):
            problems.append(f"{where}[{key!r}] must be a whole number, got {weight!r}")
        elif not 1 <= weight <= MAX_WEIGHT:
            problems.append(f"{where}[{key!r}] must be from 1 to {MAX_WEIGHT}, got {weight}")
    return problems


def weights_field() -> models.JSONField[Any, Any]:
    """``Queue.weights``: fair key -> weight (a key not named weighs 1)."""
    return models.JSONField(
        null=True,
        blank=True,
        help_text='weights of fair keys, e.g. {"tenant:1": 3} (a key not named weighs 1)',
    )
