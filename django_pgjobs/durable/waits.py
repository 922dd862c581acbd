"""What a wait for a signal or an event shares: its place in the run's history, its
timeout, and the end of the run when it must park.

A wait takes two keys of its name (two occurrences, so a loop that waits again gets
its own): the first records the wait's arrival (when it began and until when it
waits), the second its outcome (what it received, or that it timed out). A later run
replays both: the arrival keeps the deadline and the lookback where the first run
put them, and a recorded outcome is returned without looking again. Between the two,
each run looks once (``durable/signals.py``, ``durable/events.py``); finding nothing
before the deadline, it parks the job (``Parked``) with ``wakes`` as the look read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from django_pgjobs.db.cursor import json_value
from django_pgjobs.durable.control import Parked, RunFenced
from django_pgjobs.durable.run import DurableRun


def seconds(value: Any, where: str) -> float | None:
    """A duration argument (a timedelta, or seconds >= 0) as seconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    else:
        raise TypeError(f"{where} must be a timedelta, seconds or None, got {value!r}")
    if not math.isfinite(result) or result < 0:
        raise ValueError(f"{where} must be a duration of at least 0 seconds, got {value!r}")
    return result


@dataclass(frozen=True)
class Look:
    """What a look found: ``wakes`` as its snapshot read it, and the signal or event it
    took (``found``: its id, None for nothing) with its payload."""

    wakes: int
    found: int | None = None
    payload: Any = None


class Wait:
    """One call of ``wait_for_signal`` or ``wait_for_event`` in one run."""

    def __init__(self, run: DurableRun, kind: str, name: str, timeout: float | None) -> None:
        run._refuse_in_atomic(f"a wait for a {kind}")
        self.run = run
        self.kind = kind
        self.name = name
        self.arrival_key = run.next_key(name)
        self.outcome_key = run.next_key(name)
        self.timeout = timeout

    @property
    def step(self) -> str:
        """The key of the outcome, as a signal's ``consumed_by`` names it."""
        return f"{self.name}#{self.outcome_key}"

    def arrive(self, extra: Callable[[datetime], dict[str, Any]] | None = None) -> dict[str, Any]:
        """The wait's arrival: replayed, or recorded now (``since``, ``until`` and what
        ``extra(now)`` adds)."""
        entry = self.run.replay(self.name, self.arrival_key, self.kind)
        if entry is not None:
            arrival: dict[str, Any] = self.run.result_of(entry)
            return arrival
        now = self.run.now()
        until = None if self.timeout is None else now + timedelta(seconds=self.timeout)
        arrival = {
            "since": now.isoformat(),
            "until": None if until is None else until.isoformat(),
            **(extra(now) if extra else {}),
        }
        self.run.record(self.name, self.arrival_key, self.kind, arrival)
        return arrival

    def recorded(self) -> tuple[bool, Any]:
        """(True, what it received) when a run recorded the outcome already."""
        entry = self.run.replay(self.name, self.outcome_key, self.kind)
        if entry is None:
            return False, None
        outcome = self.run.result_of(entry)
        return True, None if outcome.get("timed_out") else outcome.get("payload")

    def due(self, arrival: dict[str, Any]) -> bool:
        """Whether the wait's deadline has passed."""
        until = arrival.get("until")
        return until is not None and self.run.now() >= datetime.fromisoformat(until)

    def look(self, look: Callable[[Any], Look | None]) -> Look:
        """Run ``look(cursor)`` and, when it took something, record the outcome, in one
        transaction on the jobs' database: the take and its record commit together or
        not at all (a fenced record rolls the take back)."""
        alias = self.run.alias
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            seen = look(cursor)
            if seen is None:
                raise RunFenced(f"job {self.run.job_id} no longer exists; the run stops")
            if seen.found is not None:
                payload = json_value(seen.payload)
                outcome = {self.kind: seen.found, "payload": payload}
                self.run.record(self.name, self.outcome_key, self.kind, outcome)
                return Look(seen.wakes, seen.found, payload)
        return seen

    def timed_out(self) -> None:
        """Record that the deadline passed with nothing received."""
        self.run.record(self.name, self.outcome_key, self.kind, {"timed_out": True})

    def park(self, arrival: dict[str, Any], waiting_for: dict[str, Any], seen: Look) -> Parked:
        """The end of this run: the job waits until the deadline (None: no limit) or a
        wake, whichever comes first."""
        until = arrival.get("until")
        return Parked(
            None if until is None else datetime.fromisoformat(until), waiting_for, seen.wakes
        )
