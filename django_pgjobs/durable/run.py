"""``DurableRun``: one run of a durable job against its recorded history (steps,
sleeps, patch marks), behind ``JobContext.step`` / ``sleep`` / ``patched`` / ...

The history is read once, at the run's first durable call (``STEP_HISTORY``: the
steps in order, the small results with them, the job's ``wakes`` and the database's
clock). Then each call is matched against the next recorded entry:

* the same key (name and occurrence, the n-th call of that name in this run) and
  kind: a replay, the stored result returned without calling anything;
* another key while entries remain: the code contradicts the history, and the run
  raises ``NonDeterministic`` naming both (a recorded patch mark nobody asks for any
  more is passed over, so a ``patched()`` call can be removed once no run needs it);
* no entries left: a new step, run and recorded (``durable/steps.py``), one round
  trip each.

A waiting primitive built on this (a signal, an event) takes its key with
``next_key``, looks with ``replay`` (an entry of its own kind, or None at the
frontier), records with ``record`` in its own transaction, and parks by raising
``Parked(until, waiting_for, seen_wakes)`` with ``wakes`` read in the same snapshot
as its look. Everything here runs in the job's thread; an async job's calls run on a
worker thread one at a time (``JobContext.astep`` and the others).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import History, StepRow, step_history, step_recorded
from django_pgjobs.durable import steps
from django_pgjobs.durable.control import Parked, RunFenced
from django_pgjobs.exceptions import NonDeterministic, TooManySteps

#: Step results up to this many bytes come with the history (a replay of them costs
#: no round trip); a larger one is read when its step is asked for.
INLINE_BYTES = 8192
#: Recorded names a NonDeterministic message lists, at most.
NAMES_SHOWN = 20


class DurableRun:
    """The durable state of one run of one job (made on its first durable call)."""

    def __init__(self, *, job_id: int, lease: int, task: str, alias: str | None = None):
        self.job_id = job_id
        self.lease = lease
        self.task = task
        self.alias = alias or get_settings().DATABASE
        self._history: History | None = None
        self._entries: list[StepRow] = []
        self._position = 0
        self._occurrences: dict[str, int] = {}
        self._clock = 0.0  # database time minus this process's time, in seconds
        self.in_atomic = False

    # -- the history ---------------------------------------------------------

    def _load(self) -> History:
        if self._history is None:
            history = step_history(connections[self.alias], self.job_id, inline=INLINE_BYTES)
            if history is None:
                raise RunFenced(f"job {self.job_id} no longer exists; the run stops")
            self._history = history
            self._entries = list(history.steps)
            self._clock = history.now.timestamp() - time.time()
        return self._history

    @property
    def wakes(self) -> int:
        """The job's ``wakes`` as the history read it."""
        return self._load().wakes

    def now(self) -> datetime:
        """The database's clock (as the history read it, moved on by this process's)."""
        self._load()
        return datetime.fromtimestamp(time.time() + self._clock, tz=UTC)

    def next_key(self, name: str) -> int:
        """The occurrence of this call of ``name`` in this run (0 for the first)."""
        if not isinstance(name, str) or not name or len(name) > 255:
            raise ValueError(
                f"a step name must be a non-empty str of at most 255 characters, got {name!r}"
            )
        occurrence = self._occurrences.get(name, 0)
        self._occurrences[name] = occurrence + 1
        return occurrence

    def replay(self, name: str, occurrence: int, kind: str) -> StepRow | None:
        """The recorded entry this call replays (the position moves past it), or None
        at the frontier (nothing recorded from here on). Raises ``NonDeterministic``
        when the next recorded entry is another step."""
        self._load()
        while self._position < len(self._entries):
            entry = self._entries[self._position]
            if (entry.name, entry.occurrence, entry.kind) == (name, occurrence, kind):
                self._position += 1
                return entry
            if entry.kind == "patch" and kind != "patch":
                self._position += 1  # a patch mark no code asks for any more
                continue
            raise NonDeterministic(self._contradiction(name, occurrence, kind, entry))
        return None

    def at_frontier(self) -> bool:
        """Whether nothing is recorded past this point of the run."""
        self._load()
        return self._position >= len(self._entries)

    def _contradiction(self, name: str, occurrence: int, kind: str, entry: StepRow) -> str:
        names = [f"{e.name!r}" for e in self._entries[:NAMES_SHOWN]]
        more = len(self._entries) - NAMES_SHOWN
        recorded = ", ".join(names) + (f" and {more} more" if more > 0 else "")
        return (
            f"job {self.job_id} ({self.task}): the code asked for {kind} {name!r} "
            f"(call {occurrence + 1} of that name) where the recorded history has "
            f"{entry.kind} {entry.name!r} (call {entry.occurrence + 1}) next; recorded in "
            f"order: {recorded}. The code changed under a running job: put the change "
            "behind context.patched(name), then retry the job"
        )

    def result_of(self, entry: StepRow) -> Any:
        """A replayed entry's stored result (read now when it was too large to come
        with the history)."""
        if entry.inline:
            return entry.result
        row = step_recorded(connections[self.alias], self.job_id, entry.name, entry.occurrence)
        return None if row is None else row.result

    def record(
        self, name: str, occurrence: int, kind: str, result: Any, *, encoded: str | None = None
    ) -> None:
        """Record a new entry at the frontier under the run's lease (``RunFenced``
        when the lease moved on). On the caller's transaction, if one is open."""
        limit = get_settings().MAX_STEPS
        if len(self._entries) >= limit:
            raise TooManySteps(
                f"job {self.job_id} ({self.task}) asked for {kind} {name!r} after recording "
                f"{len(self._entries)} steps, PGJOBS['MAX_STEPS'] = {limit}; split the work "
                "into jobs (a workflow), or raise the setting"
            )
        if encoded is None:
            encoded = steps.encode(result, f"{kind} {name!r} of {self.task}")
        seq = steps.record(
            self.job_id,
            self.lease,
            name,
            occurrence,
            kind,
            None,
            using=self.alias,
            encoded=encoded,
        )
        self._entries.append(StepRow(seq, name, occurrence, kind, result))
        self._position = len(self._entries)

    # -- the calls of JobContext ----------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not callable(fn):
            raise TypeError(f"step {name!r}: fn must be callable, got {type(fn).__name__}")
        self._refuse_in_atomic("a step")
        occurrence = self.next_key(name)
        entry = self.replay(name, occurrence, "step")
        if entry is not None:
            return self.result_of(entry)
        value = fn(*args, **kwargs)
        self.record(name, occurrence, "step", value)
        return value

    def sleep_until(self, name: str, when: datetime) -> None:
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise TypeError(f"sleep_until {name!r}: when must be an aware datetime, got {when!r}")
        self._sleep(name, lambda: when)

    def sleep(self, name: str, duration: timedelta | float) -> None:
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
            raise ValueError(
                f"sleep {name!r}: duration must be a timedelta or seconds >= 0, got {duration!r}"
            )
        self._sleep(name, lambda: self.now() + timedelta(seconds=seconds))

    def _sleep(self, name: str, until: Callable[[], datetime]) -> None:
        self._refuse_in_atomic("a sleep")
        occurrence = self.next_key(name)
        entry = self.replay(name, occurrence, "sleep")
        if entry is None:
            when = until()
            self.record(name, occurrence, "sleep", {"until": when.isoformat()})
        else:
            when = datetime.fromisoformat(self.result_of(entry)["until"])
        if when > self.now():
            raise Parked(when, {"kind": "sleep", "name": name}, self.wakes)

    def patched(self, name: str) -> bool:
        """True for a run that reaches this point with the new code (the mark is
        recorded or replayed), False for a run already past it (entries recorded
        beyond this point by the old code)."""
        self._refuse_in_atomic("patched()")
        occurrence = self.next_key(name)
        if self.replay_patch(name, occurrence):
            return True
        if not self.at_frontier():
            return False
        self.record(name, occurrence, "patch", None)
        return True

    def replay_patch(self, name: str, occurrence: int) -> bool:
        self._load()
        if self._position < len(self._entries):
            entry = self._entries[self._position]
            if (entry.name, entry.occurrence, entry.kind) == (name, occurrence, "patch"):
                self._position += 1
                return True
        return False

    def _refuse_in_atomic(self, what: str) -> None:
        if self.in_atomic:
            raise RuntimeError(
                f"job {self.job_id}: {what} inside an atomic step; an atomic step is one "
                "transaction and cannot hold other steps"
            )
