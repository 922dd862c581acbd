"""Chunks on the worker: the claimed jobs of a chunked task (``@job(chunk=N)``) grouped
into chunks of at most N, a chunk filled with more due jobs of its task, then run in
one call on one job thread (``running.JobRuns.run_chunk``, ``chunk_call.py``).

A chunk's first job *leads*: it goes to a job thread and takes the thread's slot.
The others *ride* along: each is an in-flight entry of its own (heartbeaten, its
lease watched, released at shutdown, timed out, its outcome written) that takes no
slot, since the chunk runs on the lead's thread. A suspect (reclaimed from a lost
worker) never joins a chunk: it runs alone in a child process, as a chunk of one,
so a crash is charged to the crasher alone (docs/explanation/guarantees.md).

Filling happens on the lead's job thread, with that thread's connection, while the
lead is still queued: the chunk's claim (``claim/chunk.py``) takes more due jobs of
the task in the lead's queue, again every ``FILL_POLL`` seconds until the chunk is
full or ``chunk_wait`` has passed. Only in a queue without a limit: the chunk's
claim counts neither ``max_running`` nor ``rate``, and respects no pause, so in a
limited or paused queue a chunk is what the worker's own (limited) claim brought.
Not with ``--max-jobs`` either, whose count is the claim loop's.

A chunk stays open to more jobs until its lead starts (``ChunkBoard``): jobs of its
task that the claim loop claims meanwhile join it rather than start a chunk of
their own, so a chunk is not split between the claim loop and its own filling.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.db import connections

from django_pgjobs import signals
from django_pgjobs.claim.chunk import claim_chunk
from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.definition import JobDefinition, row_timeout
from django_pgjobs.support import tracing
from django_pgjobs.worker.executor import make_context
from django_pgjobs.worker.failure_kinds import DB_ERRORS
from django_pgjobs.worker.inflight import QUEUED, InFlight, InFlightTable

logger = logging.getLogger("django_pgjobs")

#: How often a chunk that is not full looks for more due jobs of its task (seconds).
FILL_POLL = 0.05


def make_entry(claimed: Claimed, definition: JobDefinition | None, worker: str) -> InFlight:
    """The in-flight entry of a job just claimed, with its run's timeout."""
    timeout = (
        definition.effective_timeout(claimed.timeout)
        if definition
        else row_timeout(claimed.timeout)
    )
    return InFlight(claimed, make_context(claimed, worker), False, timeout)


class ChunkBoard:
    """The chunks open to more jobs (their lead not started), one per task: the
    claim loop's jobs of the task join it, the fill's too, until the lead closes it.
    One lock guards the chunks' lists; the in-flight table's lock is taken inside
    it (the entries are added to the table before the lead can close)."""

    def __init__(self, table: InFlightTable):
        self.table = table
        self._lock = threading.Lock()
        self._open: dict[str, InFlight] = {}

    def dispatch(
        self, entries: Sequence[InFlight], definitions: Sequence[JobDefinition | None]
    ) -> list[InFlight]:
        """Enter ``entries`` (just claimed) in the table, the jobs of chunked tasks
        (suspects left out: they run alone) joined to their task's open chunk or
        leading a new one; the entries to hand to the job runners (none of the
        riders)."""
        with self._lock:
            for entry, definition in zip(entries, definitions, strict=True):
                if definition is None or definition.chunk is None or entry.claimed.suspect:
                    continue
                self._place(entry, definition.chunk)
            self.table.add(list(entries))
        return [e for e in entries if not e.rider]

    def _place(self, entry: InFlight, size: int) -> None:
        """Under the lock: ``entry`` rides on its task's open chunk, or leads one."""
        task = entry.claimed.task
        lead = self._open.get(task)
        if lead is not None and lead.chunk is not None and len(lead.chunk) < size:
            entry.rider = True
            lead.chunk.append(entry)
            return
        entry.chunk = [entry]
        self._open[task] = entry

    def took(self, lead: InFlight, entries: list[InFlight], size: int) -> list[InFlight]:
        """Jobs the fill of ``lead``'s chunk claimed: ride on it while it has room,
        else lead chunks of their own (the claim loop's jobs filled it meanwhile); a
        suspect runs alone. Entered in the table; those to hand to the job runners."""
        with self._lock:
            chunk = lead.chunk if lead.chunk is not None else [lead]
            for entry in entries:
                if entry.claimed.suspect:
                    continue
                if len(chunk) < size:
                    entry.rider = True
                    chunk.append(entry)
                else:
                    self._place(entry, size)
            self.table.add(entries)
        return [e for e in entries if not e.rider]

    def close(self, lead: InFlight) -> list[InFlight]:
        """``lead`` is about to start: its chunk takes no more jobs. Its entries."""
        with self._lock:
            if self._open.get(lead.claimed.task) is lead:
                del self._open[lead.claimed.task]
            return list(lead.chunk or [lead])

    def room(self, lead: InFlight, size: int) -> int:
        with self._lock:
            return size - len(lead.chunk or [lead])


@dataclass(kw_only=True, eq=False)
class ChunkFill:
    """Fills a chunk with more due jobs of its task (on the lead's job thread)."""

    board: ChunkBoard
    #: the worker's claims: the queue limits its last claims read
    claimant: Claimant
    #: runs a suspect the fill claimed, alone (the job runners' submit)
    submit: Callable[[InFlight], None]
    worker_id: str
    alias: str
    #: the claim loop was told to stop: fill no more
    stopping: threading.Event
    #: False under --max-jobs: the claim loop counts every job claimed
    enabled: bool = True
    tracer: object = field(default=tracing.LOOK_UP, repr=False)

    def fill(self, lead: InFlight) -> None:
        """Claim more due jobs of ``lead``'s task into its chunk until it is full or
        its ``chunk_wait`` has passed; never raises (a failed claim ends the filling)."""
        definition = registry.find(lead.claimed.task)
        if lead.chunk is None or definition is None or definition.chunk is None:
            return
        if not self.enabled:
            return
        size = definition.chunk
        queue = lead.claimed.queue
        deadline = time.monotonic() + definition.chunk_wait
        while (room := self.board.room(lead, size)) > 0 and self._may_fill(queue, lead):
            try:
                claimed = claim_chunk(
                    connections[self.alias],
                    worker=self.worker_id,
                    queue=queue,
                    task=lead.claimed.task,
                    n=room,
                    # the worker's claims are limited ones: one at a time, as theirs
                    serialised=self.claimant.keyed or bool(self.claimant.limits),
                )
            except DB_ERRORS as exc:
                # A lost reply may leave rows claimed that this worker never heard of:
                # unbeaten, the reaper gives them back uncharged.
                logger.warning(
                    "job %s (%s): could not claim more jobs for its chunk (%s); it runs "
                    "with the jobs it has",
                    lead.claimed.id,
                    lead.claimed.task,
                    exc,
                )
                connections[self.alias].close()
                return
            if claimed:
                self._took(lead, claimed, definition)
                continue  # due jobs were there: look again at once
            left = deadline - time.monotonic()
            if left <= 0 or self.stopping.wait(min(left, FILL_POLL)):
                return

    def _may_fill(self, queue: str, lead: InFlight) -> bool:
        """The lead is still queued (not released at shutdown), the worker is not
        stopping, and ``queue`` has no limit the chunk's claim would not count."""
        if lead.state != QUEUED or self.stopping.is_set():
            return False
        limits = self.claimant.limits.get(queue)
        return limits is None or not (limits.paused or limits.max_running or limits.rate)

    def _took(self, lead: InFlight, claimed: list[Claimed], definition: JobDefinition) -> None:
        """Enter the jobs the chunk's claim took (``ChunkBoard.took``); hand the ones
        that do not ride on this chunk to the job threads."""
        entries = [make_entry(c, definition, self.worker_id) for c in claimed]
        for entry in entries:
            entry.tracer = self.tracer
        for entry in self.board.took(lead, entries, definition.chunk or 1):
            self.submit(entry)
        if signals.jobs_claimed.receivers:
            signals.send(
                signals.jobs_claimed,
                jobs=[(c.id, c.task, c.queue) for c in claimed],
                worker=self.worker_id,
            )
