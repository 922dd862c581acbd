"""How a durable run ends early: ``Parked`` (it waits: a sleep, a signal, an event) and
``RunFenced`` (its lease moved on while it recorded a step).

Both are ``BaseException``: a job's ``except Exception:`` around a step must not
swallow the run's end and carry on as if it had slept or recorded. The executor turns
``Parked`` into the outcome "waiting" (written by ``JOB_PARK`` of ``db/durable.py``:
the attempt not counted, the slot freed) and ``RunFenced`` into "fenced" (nothing
written, a warning and ``job_fenced``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_pgjobs.exceptions import PgJobsError


class Parked(BaseException):
    """The run ends here and the job waits.

    ``until``: when it wakes on its own (None: no time limit, only a wake moves it).
    ``waiting_for``: what it waits for, stored on the row for the admin and
    ``jobs_status`` (``{"kind": "sleep", "name": ...}``, ``{"kind": "signal", "name":
    ...}``, ``{"kind": "event", "name": ..., "key": ...}``). ``seen_wakes``: the job's
    ``wakes`` as read in the same snapshot as the run's last look for what it waits
    for; the park goes back to pending instead if ``wakes`` moved since.
    """

    def __init__(self, until: datetime | None, waiting_for: dict[str, Any], seen_wakes: int):
        super().__init__(until, waiting_for, seen_wakes)
        self.until = until
        self.waiting_for = waiting_for
        self.seen_wakes = seen_wakes

    def __str__(self) -> str:
        until = "no time limit" if self.until is None else f"until {self.until.isoformat()}"
        return f"parked ({self.waiting_for}, {until})"


class RunFenced(BaseException):
    """A step's record found the job no longer held by this run's lease (reclaimed,
    cancelled or retried elsewhere): nothing was recorded, and the run stops."""


class ParkedInAtomicJob(PgJobsError):
    """A sleep or a wait in an ``@job(atomic=True)`` job: the job is one transaction,
    which cannot end at the park and resume later (what it recorded rolled back with
    it). Never retried on its own: every run would do the same. Use atomic steps
    (``context.atomic_step``) in a plain job instead."""

    _pgjobs_no_retry = True  # executor.NO_RETRY, on the class


def unparkable(exc: BaseException) -> BaseException:
    """What an atomic job's failure records: ``ParkedInAtomicJob`` for a park, else
    ``exc`` itself."""
    if isinstance(exc, Parked):
        return ParkedInAtomicJob(
            f"{exc} inside an @job(atomic=True) job, whose one transaction cannot end here "
            "and resume later; use context.atomic_step blocks in a job without atomic=True"
        )
    return exc
