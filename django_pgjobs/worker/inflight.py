"""The in-flight table: every job this worker claimed, from its claim until its
outcome is written or it is released. The one place that knows what really runs.

An entry's ``state`` moves queued (claimed, waiting for a job thread or the event
loop) -> running -> done (its outcome handed to the completer); from queued or
running it may instead be released (shutdown), and from running be timed_out (the
watchdog gave up on it). The entry leaves the table when its outcome or release is
written, or when that write is given up on (counted in ``unwritten``: the reaper
reclaims those jobs).

The slot counts are what the claimer sizes its claims by: a slot is taken at
dispatch and left the moment the handler returns, times out or is released, not
when the outcome is written (outcomes waiting for the completer are counted apart,
and bounded). A run that timed out leaves its thread slot at once although its
thread may still run; ``finish`` still hears from that thread when it really ends
(it returns False then): the job runner tells the completer, which gives back the
run's *limit* slot, held in the database until then (``db/held_slots.py``).

One lock guards the entries and the counts. It is held for these few assignments
only, never across a statement or a job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django_pgjobs.claim.rows import Claimed
from django_pgjobs.jobs.context import JobContext
from django_pgjobs.support import tracing

QUEUED = "queued"
RUNNING = "running"
DONE = "done"
TIMED_OUT = "timed_out"
RELEASED = "released"


@dataclass(eq=False)
class InFlight:
    """A claimed job until its outcome is written (or it is released)."""

    claimed: Claimed
    context: JobContext
    is_async: bool = False
    timeout: float | None = None
    state: str = QUEUED
    thread: threading.Thread | None = field(default=None, repr=False)
    started: float = 0.0
    deadline: float | None = None
    #: The held limit slot (db/held_slots.py), the completer's bookkeeping alone: the
    #: row was written off while the run went on (timed out, cancelled, reclaimed) /
    #: the run given up on has really ended. Both: the slot is given back.
    written_off: bool = False
    run_over: bool = False
    #: Its outcome is on the completer's queue. Set after the put: between ``finish``
    #: (or ``expire``) and the hand-over the entry is done but its outcome is nowhere
    #: yet, and a worker stopping then must wait for it (``unsettled``), or the
    #: completer could close before it and leave the job to the reaper.
    handed: bool = False
    #: The OpenTelemetry tracer of its span (``tracing.tracer()``, asked once per claim).
    tracer: Any = field(default=tracing.LOOK_UP, repr=False)
    #: A chunk's lead (worker/chunks.py): the chunk's entries, itself first. It takes
    #: the job thread and the slot; the chunk's other entries ride along (``rider``),
    #: in the table each (beaten, fenced, written) but taking no slot.
    chunk: list[InFlight] | None = field(default=None, repr=False)
    rider: bool = False


class InFlightTable:
    """The worker's claimed jobs by id, and the job-thread and event-loop slots they take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, InFlight] = {}
        self._busy_sync = 0  # jobs queued on or running in the job threads
        self._busy_async = 0  # async jobs on the event loop
        self._riding = 0  # queued or running riders of a chunk (no slot of their own)
        #: jobs whose outcome or release could not be written, left to the reaper
        self.unwritten = 0
        self._waiting_bytes = 0  # results' JSON on the completer's queue (characters)
        #: told (id, lease) of jobs just added, before they can start: the heartbeat
        #: process (worker/pulse_link.py) must know a job that takes the GIL at once
        self.on_add: Callable[[list[tuple[int, int]]], None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[int]:
        return list(self._entries)

    def load(self) -> tuple[int, int, int]:
        """(thread slots taken, event-loop slots taken, outcomes waiting to be written)."""
        with self._lock:
            busy_sync, busy_async = self._busy_sync, self._busy_async
            waiting = len(self._entries) - busy_sync - busy_async - self._riding
        return busy_sync, busy_async, waiting

    @property
    def waiting_bytes(self) -> int:
        """Characters of results' JSON waiting for the completer: the claim pauses past
        a bound, as it does past a count, so large results cannot pile up in memory."""
        return self._waiting_bytes

    def results_waiting(self, size: int) -> None:
        """``size`` more (or, negative, fewer) characters of results wait to be written."""
        with self._lock:
            self._waiting_bytes += size

    # ------------------------------------------------------------------ moves

    def add(self, entries: list[InFlight]) -> None:
        """Just claimed: each takes a slot of its kind."""
        with self._lock:
            for entry in entries:
                self._entries[entry.claimed.id] = entry
                if entry.rider:
                    self._riding += 1
                elif entry.is_async:
                    self._busy_async += 1
                else:
                    self._busy_sync += 1
        if self.on_add is not None:
            self.on_add([(e.claimed.id, e.claimed.lease) for e in entries])

    def start(self, entry: InFlight) -> bool:
        """queued -> running, on the thread that runs it; False if released before."""
        with self._lock:
            if entry.state != QUEUED:
                return False
            entry.state = RUNNING
            entry.thread = threading.current_thread()
            entry.started = time.monotonic()
            if entry.timeout is not None:
                entry.deadline = entry.started + entry.timeout
        return True

    def finish(self, entry: InFlight) -> bool:
        """running -> done: the handler returned, its slot is free. False when the run
        had been given up on already (timed out or released): its outcome is moot."""
        with self._lock:
            if entry.state != RUNNING:
                return False
            entry.state = DONE
            self._leave_slot(entry)
        return True

    def give_back(self, entry: InFlight) -> bool:
        """queued or running -> done, to be handed back uncharged: its task ended
        without an outcome (cancelled by another job). False when it was dealt with."""
        with self._lock:
            if entry.state not in (QUEUED, RUNNING):
                return False
            entry.state = DONE
            self._leave_slot(entry)
        return True

    def expire(self, now: float) -> list[InFlight]:
        """running -> timed_out for every run past its deadline; those entries."""
        expired: list[InFlight] = []
        with self._lock:
            for entry in self._entries.values():
                if entry.state == RUNNING and entry.deadline is not None and entry.deadline <= now:
                    entry.state = TIMED_OUT
                    self._leave_slot(entry)
                    expired.append(entry)
        return expired

    def take_back(self, entries: list[InFlight]) -> list[InFlight]:
        """queued or running -> released (shutdown); those not finished meanwhile."""
        taken: list[InFlight] = []
        with self._lock:
            for entry in entries:
                if entry.state in (QUEUED, RUNNING):
                    entry.state = RELEASED
                    self._leave_slot(entry)
                    taken.append(entry)
        return taken

    def _leave_slot(self, entry: InFlight) -> None:
        """Under the lock: ``entry`` no longer occupies a thread or loop slot."""
        if entry.rider:
            self._riding -= 1
        elif entry.is_async:
            self._busy_async -= 1
        else:
            self._busy_sync -= 1

    # ------------------------------------------------------------------ leaving

    def remove(self, entry: InFlight) -> None:
        """Its outcome or release was written. Only this very entry: the job may have
        been claimed again meanwhile (retried after a timeout), a new entry."""
        with self._lock:
            if self._entries.get(entry.claimed.id) is entry:
                del self._entries[entry.claimed.id]

    def forget(self, entries: list[InFlight]) -> None:
        """Their outcome or release cannot be written: stop tracking (and
        heartbeating) them; the reaper reclaims them after STALE_AFTER."""
        with self._lock:
            for entry in entries:
                if self._entries.get(entry.claimed.id) is entry:
                    del self._entries[entry.claimed.id]
                    self.unwritten += 1

    def write_off_rest(self) -> None:
        """At exit: whatever is still here was neither written nor released."""
        with self._lock:
            self.unwritten += len(self._entries)

    # ------------------------------------------------------------------ views

    def queued_async(self) -> list[InFlight]:
        """Async jobs waiting for an event-loop slot (not started: nothing to cancel)."""
        with self._lock:
            return [e for e in self._entries.values() if e.is_async and e.state == QUEUED]

    def unsettled(self) -> list[InFlight]:
        """Jobs queued or running, or done or timed out with their outcome not yet on
        the completer's queue."""
        with self._lock:
            return [
                e
                for e in self._entries.values()
                if e.state in (QUEUED, RUNNING) or (e.state in (DONE, TIMED_OUT) and not e.handed)
            ]

    def leases(self) -> list[tuple[int, int]]:
        """(job id, lease) of every job in flight: what the heartbeat refreshes."""
        with self._lock:
            return [(e.claimed.id, e.claimed.lease) for e in self._entries.values()]

    def lease_lost(self, job_id: int, lease: int) -> Claimed | None:
        """The row's ``lease`` moved on (cancel, reaper): the run sees
        ``context.is_cancelled()``. The job's claim if that is news, else None.

        Only the run that held that very lease is cancelled: between the heartbeat's
        read of the leases and its statement, a run may have ended and the job been
        claimed again by this worker (a retry due at once) under a new lease, which
        is not lost."""
        with self._lock:
            entry = self._entries.get(job_id)
        if entry is None or entry.claimed.lease != lease or entry.context.is_cancelled():
            return None
        entry.context.cancel()
        return entry.claimed
