"""Where claimed jobs run: ``def`` jobs on the job threads (``runners``), ``async def``
jobs on the worker's event loop (``async_runner``).

For each job: mark it running in the in-flight table, call the executor (a suspect,
reclaimed from a lost worker, runs alone in a child process: ``isolated``), clean the
thread's connection (user code may have broken it), free the slot and hand the
outcome on. The slot is free the moment the handler returns; writing the outcome
is the completer's business. A run given up on meanwhile (timed out, released)
hands nothing on: the watchdog or the shutdown already dealt with it.

An async job's task cancelled by someone else than the worker (another job on the
loop: ``loop_cancels``) is given back uncharged, as a shutdown gives back a run; the
job whose code cancelled it is charged (``CancelledOtherJobs``). Every async job's
task, even one cancelled before it ever ran, ends with an outcome or given back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from django_pgjobs import signals
from django_pgjobs.exceptions import CancelledOtherJobs
from django_pgjobs.worker import chunk_call, executor, isolated, job_connection, outcomes
from django_pgjobs.worker.async_runner import AsyncRunner
from django_pgjobs.worker.inflight import RUNNING, TIMED_OUT, InFlight, InFlightTable
from django_pgjobs.worker.loop_cancels import Verdict
from django_pgjobs.worker.outcomes import Outcome
from django_pgjobs.worker.runners import JobRunners

logger = logging.getLogger("django_pgjobs")


@dataclass(kw_only=True, eq=False)
class JobRuns:
    """``submit(entry)`` runs a claimed job on a job thread or the event loop."""

    table: InFlightTable
    #: receives each outcome (the completer)
    hand_over: Callable[[InFlight, Outcome], None]
    #: receives each run's duration in seconds, and whether it was async (the claim size)
    observe: Callable[[float, bool], None]
    #: a slot was freed (the claim loop)
    wake: Callable[[], None]
    #: a run given up on (timed out) has really ended (the completer: its held slot)
    run_over: Callable[[InFlight], None]
    worker_id: str
    alias: str
    concurrency: int
    async_concurrency: int
    use_async: bool
    #: fills a chunk before its call (set by the worker; None: a chunk runs as claimed)
    fill: Callable[[InFlight], None] | None = None
    #: closes a chunk to more jobs as its lead starts; its entries (the chunk board's)
    close_chunk: Callable[[InFlight], list[InFlight]] | None = None
    threads: JobRunners[InFlight] = field(init=False)
    loop: AsyncRunner | None = field(init=False)

    def __post_init__(self) -> None:
        self.threads = JobRunners(
            self.concurrency, self.run_sync, "pgjobs-job", job_connection.serve_jobs
        )
        self.loop = (
            AsyncRunner(self.run_async, self.async_concurrency, ended=self.async_ended)
            if self.use_async
            else None
        )

    @property
    def has_loop(self) -> bool:
        return self.loop is not None

    def submit(self, entry: InFlight) -> None:
        if not entry.is_async:
            self.threads.submit(entry)
        elif self.loop is None:
            raise RuntimeError("an async job was claimed without an async runner")
        else:
            self.loop.submit(entry.claimed.id, entry)

    def take_queued(self) -> list[InFlight]:
        """Jobs waiting for a job thread, taken off its queue (shutdown), with the
        riders of the chunks among them."""
        return [e for lead in self.threads.take_queued() for e in (lead.chunk or [lead])]

    def cancel(self, entry: InFlight) -> None:
        """Stop an async run (its task is cancelled); a sync run only sees its context."""
        if entry.is_async and self.loop is not None:
            self.loop.cancel(entry.claimed.id)

    def give_up(self, entry: InFlight) -> None:
        """The run timed out: cancel its task, or abandon its thread (Python cannot stop
        one) and start a replacement."""
        if entry.is_async:
            self.cancel(entry)
        elif entry.thread is not None:
            self.threads.abandon(entry.thread)

    @property
    def abandoned_alive(self) -> int:
        """Threads abandoned by timed-out runs that are still running."""
        return self.threads.abandoned_alive

    def stop(self, *, wait: bool) -> None:
        """Drop what has not started; ``wait`` for the job threads to end."""
        self.threads.shutdown(wait=wait, cancel_pending=True)
        if self.loop is not None:
            self.loop.stop()

    # ------------------------------------------------------------------ one run

    def _start(self, entry: InFlight) -> bool:
        if not self.table.start(entry):
            return False  # released at shutdown before it started
        if signals.job_started.receivers:
            signals.send(signals.job_started, **outcomes.signal_args(entry.claimed, self.worker_id))
        return True

    def run_sync(self, entry: InFlight) -> None:
        if entry.chunk is not None:
            self.run_chunk(entry)
            return
        try:
            if not self._start(entry):
                return
            if entry.claimed.suspect:  # reclaimed from a lost worker: it runs alone
                outcome = isolated.run(entry, worker=self.worker_id, alias=self.alias)
            else:
                outcome = executor.execute(
                    entry.claimed,
                    worker=self.worker_id,
                    alias=self.alias,
                    context=entry.context,
                    tracer=entry.tracer,
                )
        except BaseException as exc:  # noqa: BLE001 - execute() should not raise; be safe
            outcome = executor.last_resort(entry.claimed, exc, self.worker_id)
        finally:
            try:
                # User code may have broken or left open its connection.
                job_connection.tidy(self.alias)
            except BaseException:
                logger.exception("could not clean up the job thread's connection")
        self._finished(entry, outcome)

    def run_chunk(self, lead: InFlight) -> None:
        """A chunk (worker/chunks.py), on the lead's job thread: filled, then its jobs
        started together and run in one call; each job's outcome handed on."""
        started: list[InFlight] = []
        outcomes_: list[Outcome] = []
        try:
            if self.fill is not None:
                try:
                    self.fill(lead)
                except Exception:  # the chunk runs with the jobs it has
                    logger.exception("could not fill the chunk of job %s", lead.claimed.id)
            chunk = self.close_chunk(lead) if self.close_chunk else list(lead.chunk or [lead])
            if not self._start(lead):  # released at shutdown while it filled
                self._give_back(chunk[1:])
                return
            started = [lead, *(e for e in chunk[1:] if self._start(e))]
            outcomes_ = chunk_call.execute_chunk(
                [(e.claimed, e.context) for e in started],
                worker=self.worker_id,
                alias=self.alias,
                tracer=lead.tracer,
            )
        except BaseException as exc:  # noqa: BLE001 - execute_chunk() should not raise
            outcomes_ = [executor.last_resort(e.claimed, exc, self.worker_id) for e in started]
        finally:
            try:
                job_connection.tidy(self.alias)  # user code may have broken it
            except BaseException:
                logger.exception("could not clean up the job thread's connection")
        for entry, outcome in zip(started, outcomes_, strict=True):
            self._finished(entry, outcome)

    def _give_back(self, entries: list[InFlight]) -> None:
        """Riders whose lead was released before it started: given back uncharged."""
        for entry in entries:
            if self.table.give_back(entry):
                self.hand_over(entry, Outcome("released"))
        self.wake()

    async def run_async(self, entry: InFlight) -> None:
        if not self._start(entry):
            return
        cancelled = False
        try:
            outcome = await executor.aexecute(
                entry.claimed,
                worker=self.worker_id,
                alias=self.alias,
                context=entry.context,
                tracer=entry.tracer,
            )
        except asyncio.CancelledError as exc:
            cancelled = True
            outcome = executor.last_resort(entry.claimed, exc, self.worker_id)
        except BaseException as exc:  # noqa: BLE001 - aexecute() should not raise; be safe
            outcome = executor.last_resort(entry.claimed, exc, self.worker_id)
        verdict = self._settle(entry)
        if cancelled and entry.state != RUNNING:
            # cancelled by the worker: the watchdog or the shutdown already dealt with it
            self._ended_after_give_up(entry)
            await self._roll_back_left_open()
            return
        if verdict.struck:
            outcome = self._charged(entry, verdict)
        elif verdict.hit_by and (cancelled or outcome.kind in ("retry", "dead")):
            # Its failure may be the foreign cancel's doing: never charge it for that.
            outcome = _given_back(verdict)
        self._finished(entry, outcome)
        if cancelled:
            await self._roll_back_left_open()
        if outcome.kind in ("retry", "dead", "released"):
            await self._clean_orm_connection()

    def async_ended(self, entry: InFlight) -> None:
        """An async job's task is over. One that never ran (cancelled by another job
        before it started, or while it waited for a slot of the loop) is given back:
        left queued, it stayed claimed, running and heartbeaten, for good."""
        verdict = self._settle(entry)
        if self.table.give_back(entry):
            self.hand_over(entry, _given_back(verdict))
            self.wake()

    def _settle(self, entry: InFlight) -> Verdict:
        """What other jobs' cancels did to this run (and its cancels to them)."""
        return Verdict() if self.loop is None else self.loop.cancels.settle(entry.claimed.id)

    def _charged(self, entry: InFlight, verdict: Verdict) -> Outcome:
        """The run cancelled other jobs' tasks: a failed attempt of its own, whatever
        it returned."""
        jobs = ", ".join(sorted(str(key) for key in verdict.struck))
        exc = CancelledOtherJobs(
            f"job {entry.claimed.id} ({entry.claimed.task}) cancelled tasks of job(s) {jobs} on the "
            "worker's event loop; the jobs it cancelled were given back, uncharged"
        )
        return executor.last_resort(entry.claimed, exc, self.worker_id)

    async def _clean_orm_connection(self) -> None:
        """``async def`` jobs' ORM calls share one connection (on asgiref's
        thread-sensitive thread), which outlives each job: after a failed run, drop it
        if the failure left it unusable, as ``run_sync`` does for a job thread after
        every run. Without this, once a restart or a failover broke it, every later
        async job's query failed with "the connection is closed"."""
        try:
            await sync_to_async(job_connection.tidy, thread_sensitive=True)(self.alias)
        except Exception:  # the next failure tries again
            logger.exception("could not clean up the async jobs' connection")

    async def _roll_back_left_open(self) -> None:
        """A run cancelled inside a raw transaction on the shared ORM connection left
        it open, "idle in transaction" and holding the xmin horizon until the next
        async job returned, however long that took: roll it back now."""
        try:
            await job_connection.async_left_open(self.alias, since=-1)
        except (Exception, asyncio.CancelledError):  # shutdown: the exit closes it
            logger.exception("could not check the async jobs' connection")

    def _ended_after_give_up(self, entry: InFlight) -> None:
        """A timed-out run has really ended: its limit slot may go back now."""
        if entry.state == TIMED_OUT:
            self.run_over(entry)

    def _finished(self, entry: InFlight, outcome: Outcome) -> None:
        """The handler returned: free its slot now; the completer writes the outcome."""
        elapsed = time.monotonic() - entry.started
        if not self.table.finish(entry):
            if entry.state == TIMED_OUT:
                logger.warning(
                    "job %s (%s): the run abandoned after its timeout returned "
                    "after %.1fs; its outcome is discarded",
                    entry.claimed.id,
                    entry.claimed.task,
                    elapsed,
                )
            self._ended_after_give_up(entry)
            return
        self.observe(elapsed, entry.is_async)
        self.hand_over(entry, outcome)
        self.wake()


def _given_back(verdict: Verdict) -> Outcome:
    """Its run is handed back as a shutdown hands one back: pending, attempt not counted."""
    by = sorted(str(key) for key in verdict.hit_by if key is not None)
    return Outcome("released", extra={"cancelled_by": ", ".join(f"job {key}" for key in by)})
