"""The claimer: the worker's main loop. It claims due jobs in one round trip, sized to
the free slots plus a small prefetch, hands them to the runners, and sleeps until a
NOTIFY, a freed slot or the jittered poll. At shutdown it gives back what has not
started and releases what does not finish in time.

``ClaimSize`` decides how many jobs a claim takes; ``Claimer`` does the claiming.
The claim itself is one call, ``Claimant.take`` (``claim/claimant.py``), which skips
paused and full queues and unknown tasks and runs the claim statement; its locks are
explained beside the statements (``claim/plain.py``, ``claim/limited.py``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections

from django_pgjobs import signals
from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.store import (
    job_dead_exhausted,
    job_heartbeat,
    job_release,
    job_release_many,
)
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.definition import row_timeout
from django_pgjobs.support import tracing
from django_pgjobs.support.throttle import Backoff
from django_pgjobs.worker import outcomes
from django_pgjobs.worker.chunks import ChunkBoard
from django_pgjobs.worker.executor import make_context
from django_pgjobs.worker.failure_kinds import CONNECTION_ERRORS, DATA_ERRORS, DB_ERRORS
from django_pgjobs.worker.inflight import InFlight, InFlightTable
from django_pgjobs.worker.running import JobRuns

logger = logging.getLogger("django_pgjobs")

#: Characters of results' JSON waiting for the completer past which claiming pauses:
#: jobs returning large values are written before more are run (a few batches of
#: ``completer.BATCH_BYTES``).
MAX_WAITING_BYTES = 32 * 1024 * 1024
#: Longest a saturated worker waits for more free slots before a claim (seconds).
GATHER_WAIT = 0.005
#: Work a prefetch should cover: the time a claim takes, with margin (seconds).
PREFETCH_COVER = 0.02


class ClaimSize:
    """How many jobs the next claim takes, from the free slots, the observed job
    times and the kind of jobs the last claim brought (docs/explanation/performance.md)."""

    def __init__(self, *, concurrency: int, async_concurrency: int, batch: int):
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        self.batch = batch
        # A busy worker waits (at most GATHER_WAIT) until this many slots are free
        # before claiming again, so claims stay batches instead of 1-2 rows each.
        self.floor = max(1, min(batch, concurrency) // 4)
        # Outcomes waiting for the completer: past this, claiming pauses.
        self.max_waiting = max(2 * batch, 2 * concurrency)
        self.kind = "sync"  # what the last claim brought: sync, async or mixed
        self.job_time: float | None = None  # moving average of a sync run (seconds)
        self.async_job_time: float | None = None  # the same for async runs

    def observe(self, elapsed: float, is_async: bool) -> None:
        """A run took ``elapsed`` seconds (called on the thread that ran it)."""
        if is_async:
            previous = self.async_job_time
            self.async_job_time = elapsed if previous is None else previous * 0.9 + elapsed * 0.1
        else:
            previous = self.job_time
            self.job_time = elapsed if previous is None else previous * 0.9 + elapsed * 0.1

    def claimed(self, entries: list[InFlight]) -> None:
        kinds = {e.is_async for e in entries}
        self.kind = "mixed" if len(kinds) == 2 else "async" if True in kinds else "sync"

    def min_claim(self) -> int:
        """The smallest claim a busy worker makes: a quarter of its threads plus
        prefetch (claims of a few rows each cost a round trip per job)."""
        return min(self.batch, max(self.floor, (self.concurrency + self.prefetch()) // 4))

    def prefetch(self) -> int:
        """Jobs to hold beyond the free threads, so the next job starts without a
        claim round trip: what the threads finish in PREFETCH_COVER at the observed
        job time, at most ``--batch``; none until a job time has been observed, and
        about none for slow jobs, so one worker does not hoard work others could
        start. Capped at ``--batch`` rather than ``concurrency``: for fast jobs the
        claim's fixed cost per round trip is what limits a drain of them
        (docs/explanation/performance.md)."""
        job_time = self.job_time
        if job_time is None:
            return 0
        return min(self.batch, int(self.concurrency * PREFETCH_COVER / max(job_time, 1e-4)))

    def async_prefetch(self) -> int:
        """The same for the event loop: prefetched coroutines wait on its semaphore and
        start the moment a slot frees."""
        job_time = self.async_job_time
        if job_time is None:
            return 0
        return min(
            self.async_concurrency,
            int(self.async_concurrency * PREFETCH_COVER / max(job_time, 1e-4)),
        )

    def claimable(self, load: tuple[int, int, int], *, has_loop: bool) -> int:
        """How many jobs the next claim may take, given the in-flight ``load`` (thread
        slots taken, loop slots taken, outcomes waiting): free thread slots plus
        prefetch, free async slots, at most --batch, none while too many outcomes
        wait to be written."""
        busy_sync, busy_async, waiting = load
        if waiting >= self.max_waiting:
            return 0
        sync_part = max(0, self.concurrency + self.prefetch() - busy_sync)
        if has_loop:
            # A claim cannot choose sync or async jobs: size it for the kind the last
            # claim brought (jobs of the other kind in it run all the same), so
            # neither kind is hoarded for the other's free slots.
            async_part = max(0, self.async_concurrency + self.async_prefetch() - busy_async)
            if self.kind == "async":
                sync_part = async_part
            elif self.kind == "mixed":
                sync_part += async_part
        return min(
            sync_part,
            self.batch if self.kind != "async" else max(self.batch, self.async_concurrency),
        )


@dataclass(kw_only=True, eq=False)
class Claimer:
    """Claims and dispatches until stopped (or, with ``burst``/``max_jobs``, done)."""

    table: InFlightTable
    size: ClaimSize
    #: the worker's claims: it takes the jobs (queue limits, known tasks, the front)
    claimant: Claimant
    #: releases at shutdown, by kind (the worker's summary)
    counts: dict[str, int]
    worker_id: str
    alias: str
    burst: bool
    max_jobs: int | None
    poll_interval: float
    shutdown_timeout: float
    #: a claim slower than this (HEARTBEAT_INTERVAL) refreshes its rows' heartbeats
    late_after: float
    claimed_count: int = field(default=0, init=False)
    #: the chunks open to more jobs (worker/chunks.py)
    chunks: ChunkBoard = field(init=False)
    _wakeup: threading.Event = field(default_factory=threading.Event, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)  # stop claiming

    def __post_init__(self) -> None:
        self.chunks = ChunkBoard(self.table)

    def wake(self) -> None:
        """Something changed (a slot freed, an outcome written, a NOTIFY): look again.

        Called once per finished job: already set, it is left alone (``Event.set``
        takes a lock and notifies; the loop clears the event before it looks, so a
        change made before this call is seen either way)."""
        if not self._wakeup.is_set():
            self._wakeup.set()

    @property
    def stopping(self) -> threading.Event:
        """Set once the claim loop is told to stop (a chunk being filled stops too)."""
        return self._stop

    def request_stop(self) -> None:
        self._stop.set()
        self._wakeup.set()

    def on_notify(self, payload: str) -> None:
        """A NOTIFY on the jobs channel (the listener's thread); "" after LISTEN
        (re)connected, when notifications may have been missed."""
        if self.claimant.heard(payload):
            self._wakeup.set()

    # ------------------------------------------------------------------ the loop

    def claim_loop(self, runs: JobRuns) -> None:
        backoff = Backoff("claim connection")
        connection = connections[self.alias]
        while not self._stop.is_set():
            self._wakeup.clear()
            want = self.claimable(runs)
            if (
                want <= 0
                and self.max_jobs is not None
                and not len(self.table)
                and self.claimed_count >= self.max_jobs
            ):
                break
            if 0 < want < self.size.min_claim() and len(self.table):
                want = self.gather_slots(runs, want)
            got = 0
            if want > 0:
                began = time.monotonic()
                try:
                    claimed = self.claimant.take(connection, want)
                    backoff.succeeded()
                except CONNECTION_ERRORS as exc:
                    backoff.failed(exc)
                    connection.close()
                    self._stop.wait(backoff.delay())
                    continue
                except DATA_ERRORS as exc:
                    # One row's state broke the claim (not the connection): isolate it.
                    if not self.repair_claim(connection, exc):
                        backoff.failed(exc)
                        self._stop.wait(backoff.delay())
                    continue
                except Exception as exc:  # the claim loop must not die
                    backoff.failed(exc)
                    if isinstance(exc, DatabaseError):
                        connection.close()
                    else:
                        logger.exception("unexpected error in the claim loop")
                    self._stop.wait(backoff.delay())
                    continue
                got = len(claimed)
                self.claimed_count += got
                if got:
                    took = time.monotonic() - began
                    if took > self.late_after:
                        self.refresh(connection, claimed, took)
                    self.dispatch(runs, claimed)
                if got == want:
                    continue  # there may be more due work: claim again at once
            if self.burst and got == 0 and not len(self.table):
                break
            # Idle or full: sleep until NOTIFY, a freed slot, or the jittered poll.
            self._wakeup.wait(self.poll_interval * random.uniform(0.8, 1.2))

    def claimable(self, runs: JobRuns) -> int:
        """The next claim's size (``ClaimSize.claimable``), no more than --max-jobs leaves;
        none while the results waiting for the completer pass ``MAX_WAITING_BYTES``."""
        if self.table.waiting_bytes >= MAX_WAITING_BYTES:
            return 0
        want = self.size.claimable(self.table.load(), has_loop=runs.has_loop)
        if self.max_jobs is not None:
            want = min(want, self.max_jobs - self.claimed_count)
        return want

    def gather_slots(self, runs: JobRuns, want: int) -> int:
        """Saturated: wait up to GATHER_WAIT for ``min_claim`` free slots (without it
        a saturated worker claims one or two rows at a time, a round trip per job)."""
        deadline = time.monotonic() + GATHER_WAIT
        floor = self.size.min_claim()
        while want < floor and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not len(self.table):
                break
            self._wakeup.wait(left)
            self._wakeup.clear()
            want = self.claimable(runs)
        return want

    def repair_claim(self, connection: Any, exc: BaseException) -> bool:
        """A claim failed with a data error: dead-letter the rows that cause it (pending
        with their attempts used up), each logged with its id. True if any were found."""
        try:
            fixed = job_dead_exhausted(connection, worker=self.worker_id)
        except DB_ERRORS as repair_exc:
            logger.error(
                "claim failed with a data error (%s) and the repair failed too: %s", exc, repair_exc
            )
            connection.close()
            return False
        for job_id, task in fixed:
            logger.error(
                "job %s (%s) was pending with its attempts used up, which failed "
                "every claim of its queue (%s); dead-lettered",
                job_id,
                task,
                exc,
                extra={"job_id": job_id, "task": task, "worker": self.worker_id},
            )
        if not fixed:
            logger.error("claim failed with a data error that no known row state explains: %s", exc)
        return bool(fixed)

    def refresh(self, connection: Any, claimed: list[Claimed], took: float) -> None:
        """A claim slower than a heartbeat interval waited (for the flow lock another
        worker held, or for the GIL a job of this worker held while its reply came):
        its rows' heartbeat is the claim's start, perhaps STALE_AFTER ago already, and
        no beat knows them yet. Refreshed now, before they are handed out, so the reaper
        does not take them for a lost worker's (docs/explanation/guarantees.md)."""
        logger.info(
            "worker %s: a claim of %d job(s) took %.1fs; their heartbeats refreshed at once",
            self.worker_id,
            len(claimed),
            took,
        )
        try:
            job_heartbeat(connection, [(c.id, c.lease) for c in claimed])
        except DB_ERRORS as exc:
            logger.warning("could not refresh the heartbeats of a slow claim: %s", exc)
            connection.close()

    def dispatch(self, runs: JobRuns, claimed: list[Claimed]) -> None:
        """Enter the claimed jobs in the in-flight table, then hand them to the runners."""
        entries: list[InFlight] = []
        definitions = []
        tracer = tracing.tracer()
        for c in claimed:
            definition = registry.find(c.task)
            timeout = (
                definition.effective_timeout(c.timeout) if definition else row_timeout(c.timeout)
            )
            is_async = bool(
                runs.has_loop
                and definition is not None
                and definition.is_async
                and not definition.atomic
                and definition.chunk is None  # a chunk runs on a job thread
                and not c.suspect  # a suspect's job thread waits for its own process
            )
            entry = InFlight(c, make_context(c, self.worker_id), is_async, timeout)
            entry.tracer = tracer
            entries.append(entry)
            definitions.append(definition)
        self.size.claimed(entries)
        # into the table; a chunked task's jobs grouped (riders take no slot)
        runnable = self.chunks.dispatch(entries, definitions)
        if signals.jobs_claimed.receivers:
            signals.send(
                signals.jobs_claimed,
                jobs=[(c.id, c.task, c.queue) for c in claimed],
                worker=self.worker_id,
            )
        for entry in runnable:
            runs.submit(entry)

    # ------------------------------------------------------------------ shutdown

    def drain(self, runs: JobRuns) -> bool:
        """Give prefetched jobs back at once; wait for running jobs and unwritten
        outcomes up to SHUTDOWN_TIMEOUT; then release what still runs. True when
        nothing had to be released that was still running."""
        connection = connections[self.alias]
        waiting = self.table.queued_async()
        self.release(connection, self.take_back(runs, runs.take_queued() + waiting))
        deadline = time.monotonic() + (self.shutdown_timeout if self._stop.is_set() else 1e9)
        while len(self.table) and time.monotonic() < deadline:
            self._wakeup.wait(0.05)
            self._wakeup.clear()
            if not self.table.unsettled():
                break  # only outcomes on the completer's queue are left
        leftovers = self.take_back(runs, self.table.unsettled())
        self.release(connection, leftovers)
        return not leftovers

    def take_back(self, runs: JobRuns, entries: list[InFlight]) -> list[InFlight]:
        """Mark ``entries`` released (those not finished meanwhile); cancel their runs."""
        taken = self.table.take_back(entries)
        for entry in taken:
            entry.context.cancel()
            runs.cancel(entry)
        return taken

    def release(self, connection: Any, entries: list[InFlight]) -> None:
        """Put ``entries`` back to pending, attempt not counted (fenced by lease): those
        never started in one statement, each still running in one of its own."""
        waiting = [entry for entry in entries if not entry.started]
        if len(waiting) > 1:
            self.release_waiting(connection, waiting)
            entries = [entry for entry in entries if entry.started]
        for entry in entries:
            claimed = entry.claimed
            try:
                ok = job_release(
                    connection,
                    id=claimed.id,
                    lease=claimed.lease,
                    still_running=entry.started > 0,  # its run started: it may go on
                )
            except DB_ERRORS as exc:
                logger.warning("could not release job %s (the reaper will): %s", claimed.id, exc)
                connection.close()
                self.table.forget([entry])
                continue
            if self.released(entry, ok):
                logger.warning(
                    "released job %s (%s) unfinished at shutdown; attempt not counted",
                    claimed.id,
                    claimed.task,
                )

    def released(self, entry: InFlight, ok: bool) -> bool:
        """``entry``'s release was written (``ok``: it was still ours): off the table,
        counted, signalled; ``ok`` returned."""
        self.table.remove(entry)
        if ok:
            self.counts["released"] += 1
            signals.send(
                signals.job_released, **outcomes.signal_args(entry.claimed, self.worker_id)
            )
        else:
            # A zombie's release: fenced like every other write, so say so.
            self.counts["fenced"] += 1
            outcomes.report_fenced(entry.claimed, "release", worker=self.worker_id)
        return ok

    def release_waiting(self, connection: Any, entries: list[InFlight]) -> None:
        """Release jobs claimed ahead that never started (up to ``--batch`` of them at a
        stop during a drain of fast jobs): one statement and one log line for all."""
        try:
            released = job_release_many(
                connection, [(e.claimed.id, e.claimed.lease) for e in entries]
            )
        except DB_ERRORS as exc:
            logger.warning(
                "could not release %d jobs not started (the reaper will): %s", len(entries), exc
            )
            connection.close()
            self.table.forget(entries)
            return
        ids = [e.claimed.id for e in entries if self.released(e, e.claimed.id in released)]
        if ids:
            shown = ", ".join(map(str, ids[:20])) + (
                f" and {len(ids) - 20} more" if len(ids) > 20 else ""
            )
            logger.warning(
                "released jobs not started at shutdown (claimed ahead): %d, attempts not "
                "counted; ids %s",
                len(ids),
                shown,
                extra={"job_ids": ids, "worker": self.worker_id},
            )
