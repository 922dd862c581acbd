"""The worker: claims jobs, runs them, writes their outcomes — pipelined.

Threads, each with its own database connection:

* main: the claim loop. Claims up to the free slots plus a small prefetch
  (``--batch`` at most) in one round trip and hands jobs to the runners, then
  sleeps until a NOTIFY, a freed slot or the jittered poll timeout;
* runners: ``--concurrency`` threads run sync handlers (user code, so Django
  connections are cleaned after each job); ``async def`` jobs run as tasks on one
  event loop (``--async-concurrency`` at once);
* completer: batches completions into one statement and writes retries/dead
  letters. A slot is free the moment its handler returns: outcomes waiting to be
  written are tracked (heartbeated, written before exit) separately, and bounded;
* heartbeat: refreshes all claimed jobs in one statement, notices lost leases
  (cancel, reaper) and keeps the ``Worker`` row fresh;
* watchdog: gives up on runs past their timeout (lease bumped);
* listener (LISTEN), maintenance (reaper and friends).

Every thread survives any exception from the code it runs: a job that breaks
the worker's own machinery fails alone, with a clear error entry.

No transaction stays open while a job runs, except inside ``@job(atomic=True)``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
)

from django_pgjobs import flow, registry, signals, sql
from django_pgjobs.conf import get_settings
from django_pgjobs.context import JobContext
from django_pgjobs.maintenance.services import MaintenanceThread, Service, default_services
from django_pgjobs.throttle import Backoff
from django_pgjobs.worker import executor, outcomes
from django_pgjobs.worker.async_runner import AsyncRunner
from django_pgjobs.worker.executor import execute, make_context
from django_pgjobs.worker.listener import Listener
from django_pgjobs.worker.outcomes import Outcome
from django_pgjobs.worker.runners import JobRunners

logger = logging.getLogger("django_pgjobs")

DB_ERRORS = (OperationalError, InterfaceError, DatabaseError)
#: Errors that say the connection (or server) is in trouble: reconnect, back off and
#: repeat the same statement. Any other error is about the data of some row.
CONNECTION_ERRORS = (OperationalError, InterfaceError)
#: Errors a claim statement raises when one row's state breaks a constraint.
DATA_ERRORS = (IntegrityError, DataError)

#: Longest a saturated worker waits for more free slots before a claim (seconds).
GATHER_WAIT = 0.005
#: Defaults of ``runjobs`` (chosen by measurement; docs/explanation/performance.md).
DEFAULT_CONCURRENCY = 16
DEFAULT_ASYNC_CONCURRENCY = 100
#: Work a prefetch should cover: the time a claim takes, with margin (seconds).
PREFETCH_COVER = 0.02
#: How often the watchdog looks for runs past their timeout (seconds).
WATCHDOG_INTERVAL = 0.1


@dataclass(eq=False)
class InFlight:
    """A claimed job until its outcome is written (or it is released).

    ``state``: queued (prefetched, not started) -> running -> done (outcome handed
    to the completer); or -> timed_out (the watchdog wrote it off) or released.
    """

    claimed: sql.Claimed
    context: JobContext
    is_async: bool = False
    timeout: float | None = None
    state: str = "queued"
    thread: threading.Thread | None = field(default=None, repr=False)
    started: float = 0.0
    deadline: float | None = None


def make_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """One ``runjobs`` process. ``run()`` returns the exit code: 0 when every job it
    claimed was written or released, 1 when some could not be (their outcome or
    release failed) and are left to the reaper. ``restart_reason`` is set when the
    worker stopped itself to be restarted (abandoned threads)."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY,
        batch: int | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        poll_interval: float | None = None,
        listen: bool | None = None,
        maintenance: bool = True,
        services: list[Service] | None = None,
        alias: str | None = None,
        worker_id: str | None = None,
        install_signal_handlers: bool = True,
        max_abandoned: int | None = None,
    ):
        conf = get_settings()
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if async_concurrency < 1:
            raise ValueError(f"async_concurrency must be >= 1, got {async_concurrency}")
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        self.batch = batch or conf.BATCH_SIZE
        # A busy worker waits (at most GATHER_WAIT) until this many slots are free
        # before claiming again, so claims stay batches instead of 1-2 rows each.
        self.min_claim = max(1, min(self.batch, concurrency) // 4)
        # Outcomes waiting for the completer: past this, claiming pauses.
        self.max_unwritten = max(2 * self.batch, 2 * concurrency)
        self.max_abandoned = concurrency if max_abandoned is None else max_abandoned
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = conf.POLL_INTERVAL if poll_interval is None else poll_interval
        self.listen = conf.LISTEN if listen is None else listen
        self.alias = alias or conf.DATABASE
        self.id = worker_id or make_worker_id()
        self.heartbeat_interval = conf.HEARTBEAT_INTERVAL
        self.shutdown_timeout = conf.SHUTDOWN_TIMEOUT
        self.install_signal_handlers = install_signal_handlers
        self.services = (
            services
            if services is not None
            else default_services(alias=self.alias, worker=self.id)
            if maintenance
            else []
        )

        # Flow control and deploy skew: claim only known tasks, honour queue limits.
        self.flow = flow.FlowState(self.queues, notified=self.listen)
        self.inflight: dict[int, InFlight] = {}
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stop = threading.Event()  # stop claiming
        self._threads_stop = threading.Event()  # stop helper threads
        self._done: queue.SimpleQueue[tuple[InFlight, Outcome] | None] = queue.SimpleQueue()
        self._signals_seen = 0
        self._busy_sync = 0  # jobs queued on or running in the job threads
        self._busy_async = 0  # async jobs on the event loop
        self._claim_kind = "sync"  # what the last claim brought: sync, async or mixed
        self._job_time: float | None = None  # moving average of a sync run (seconds)
        self._async_job_time: float | None = None  # the same for async runs
        self._pool: JobRunners[InFlight] | None = None
        self._async: AsyncRunner | None = None
        self.restart_reason: str | None = None
        self.claimed_count = 0
        #: jobs whose outcome or release could not be written, left to the reaper
        #: (run() then returns 1)
        self.unwritten = 0
        # timed_out: runs given up on (each also counted as retry or dead)
        self.counts = {
            "completed": 0,
            "retry": 0,
            "dead": 0,
            "fenced": 0,
            "released": 0,
            "timed_out": 0,
        }

    # ------------------------------------------------------------------ control

    def request_stop(self) -> None:
        """Graceful: stop claiming; in-flight jobs get SHUTDOWN_TIMEOUT to finish."""
        self._stop.set()
        self._wakeup.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals_seen += 1
        if self._signals_seen == 1:
            logger.warning(
                "worker %s got %s: finishing %d in-flight jobs (up to %gs), claiming no more; "
                "send it again to exit at once",
                self.id,
                signal.Signals(signum).name,
                len(self.inflight),
                self.shutdown_timeout,
            )
            self.request_stop()
        else:
            logger.warning(
                "worker %s: second signal, exiting at once; the reaper will "
                "reclaim %d in-flight jobs",
                self.id,
                len(self.inflight),
            )
            os._exit(1)

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        use_async = any(d.is_async and not d.atomic for d in registry.all_definitions())
        logger.info(
            "worker %s starting: queues=%s concurrency=%d async_concurrency=%s batch=%d "
            "listen=%s burst=%s",
            self.id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.async_concurrency if use_async else "- (no async jobs)",
            self.batch,
            self.listen,
            self.burst,
        )
        pool: JobRunners[InFlight] = JobRunners(self.concurrency, self._run_job, "pgjobs-job")
        self._pool = pool
        if use_async:
            self._async = AsyncRunner(self._run_async, self.async_concurrency)
        helpers: list[threading.Thread] = [
            threading.Thread(target=self._completer, name="pgjobs-completer", daemon=True),
            threading.Thread(target=self._heartbeat, name="pgjobs-heartbeat", daemon=True),
            threading.Thread(target=self._watchdog, name="pgjobs-watchdog", daemon=True),
        ]
        if self.listen:
            helpers.append(Listener(self.alias, self._on_notify, self._threads_stop))
        if self.services:
            helpers.append(MaintenanceThread(self.services, self._threads_stop, self.alias))
        self._register_worker()
        flow.sync_queues_quietly(self.alias)
        for thread in helpers:
            thread.start()
        try:
            self._claim_loop(pool)
            clean = self._drain(pool)
        finally:
            self._threads_stop.set()
            self._done.put(None)
            # Every helper first: a heartbeat still running could re-create the
            # Worker row deleted below.
            self._join(helpers)
            self._unregister_worker()
            connections[self.alias].close()
        pool.shutdown(wait=clean, cancel_pending=True)
        if self._async is not None:
            self._async.stop()
        with self._lock:
            self.unwritten += len(self.inflight)  # the completer did not get to them
        logger.info("worker %s stopped: %s", self.id, self.counts)
        if self.restart_reason:
            logger.warning("worker %s stopped to be restarted: %s", self.id, self.restart_reason)
        if self.unwritten:
            logger.error(
                "worker %s: %d job(s) could not be written back (outcome or release); the "
                "reaper reclaims them after STALE_AFTER",
                self.id,
                self.unwritten,
            )
            return 1
        return 0

    def _join(self, helpers: list[threading.Thread]) -> None:
        """Wait for the helper threads (told to stop) to end, all within one deadline:
        the completer's last writes, a heartbeat or maintenance pass in progress."""
        deadline = time.monotonic() + max(10.0, self.shutdown_timeout)
        for thread in helpers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                logger.warning(
                    "worker %s: thread %s did not stop in time; exiting without it",
                    self.id,
                    thread.name,
                )

    def _on_notify(self, payload: str) -> None:
        if payload == flow.QUEUES_CHANGED:
            self.flow.invalidate()  # a queue was paused, resumed or edited
        else:
            self.flow.saw_queue(payload)  # a job in a queue the claims may not cover yet
        if not payload or self.queues is None or payload in self.queues:
            self._wakeup.set()

    def _claim_loop(self, pool: JobRunners[InFlight]) -> None:
        backoff = Backoff("claim connection")
        connection = connections[self.alias]
        while not self._stop.is_set():
            self._wakeup.clear()
            want = self._claimable()
            if (
                want <= 0
                and self.max_jobs is not None
                and not self.inflight
                and self.claimed_count >= self.max_jobs
            ):
                break
            if 0 < want < self._min_claim() and self.inflight:
                want = self._gather_slots(want)
            got = 0
            if want > 0:
                try:
                    claimed = self.flow.claim(connection, worker=self.id, n=want)
                    backoff.succeeded()
                except CONNECTION_ERRORS as exc:
                    backoff.failed(exc)
                    connection.close()
                    self._stop.wait(backoff.delay())
                    continue
                except DATA_ERRORS as exc:
                    # One row's state broke the claim (not the connection): isolate it.
                    if not self._repair_claim(connection, exc):
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
                    self._dispatch(pool, claimed)
                if got == want:
                    continue  # there may be more due work: claim again at once
            if self.burst and got == 0 and not self.inflight:
                break
            # Idle or full: sleep until NOTIFY, a freed slot, or the jittered poll.
            self._wakeup.wait(self.poll_interval * random.uniform(0.8, 1.2))

    def _repair_claim(self, connection: Any, exc: BaseException) -> bool:
        """A claim failed with a data error: dead-letter the rows that cause it (pending
        with their attempts used up), each logged with its id. True if any were found."""
        try:
            fixed = sql.dead_exhausted(connection, worker=self.id)
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
                extra={"job_id": job_id, "task": task, "worker": self.id},
            )
        if not fixed:
            logger.error("claim failed with a data error that no known row state explains: %s", exc)
        return bool(fixed)

    def _dispatch(self, pool: JobRunners[InFlight], claimed: list[sql.Claimed]) -> None:
        entries: list[InFlight] = []
        for c in claimed:
            definition = registry.find(c.task)
            timeout = definition.effective_timeout(c.timeout) if definition else c.timeout
            is_async = bool(
                self._async is not None
                and definition is not None
                and definition.is_async
                and not definition.atomic
            )
            entries.append(InFlight(c, make_context(c, self.id), is_async, timeout))
        kinds = {e.is_async for e in entries}
        self._claim_kind = "mixed" if len(kinds) == 2 else "async" if True in kinds else "sync"
        with self._lock:
            for entry in entries:
                self.inflight[entry.claimed.id] = entry
                if entry.is_async:
                    self._busy_async += 1
                else:
                    self._busy_sync += 1
        if signals.jobs_claimed.receivers:
            signals.send(
                signals.jobs_claimed,
                jobs=[(c.id, c.task, c.queue) for c in claimed],
                worker=self.id,
            )
        for entry in entries:
            if entry.is_async:
                if self._async is None:
                    raise RuntimeError("an async job was claimed without an async runner")
                self._async.submit(entry.claimed.id, entry)
            else:
                pool.submit(entry)

    def _gather_slots(self, want: int) -> int:
        """Saturated: wait up to GATHER_WAIT for ``min_claim`` free slots (a profile of
        no-op drains showed claims of 1-2 rows each, one round trip per job)."""
        deadline = time.monotonic() + GATHER_WAIT
        floor = self._min_claim()
        while want < floor and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not self.inflight:
                break
            self._wakeup.wait(left)
            self._wakeup.clear()
            want = self._claimable()
        return want

    def _min_claim(self) -> int:
        """The smallest claim a busy worker makes: a quarter of its threads plus
        prefetch (claims of a few rows each cost a round trip per job)."""
        return min(self.batch, max(self.min_claim, (self.concurrency + self._prefetch()) // 4))

    def _prefetch(self) -> int:
        """Jobs to hold beyond the free threads, so the next job starts without a
        claim round trip: what the threads finish in PREFETCH_COVER at the observed
        job time, at most ``--batch``; none until a job time has been observed, and
        about none for slow jobs, so one worker does not hoard work others could
        start. Capped at ``--batch`` rather than ``concurrency``: for fast jobs the
        claim's fixed cost is what matters, and claims of up to 100 rows instead of
        32 took the plain no-op drain from ~23k to ~30k jobs/s
        (docs/explanation/performance.md)."""
        job_time = self._job_time
        if job_time is None:
            return 0
        return min(self.batch, int(self.concurrency * PREFETCH_COVER / max(job_time, 1e-4)))

    def _async_prefetch(self) -> int:
        """The same for the event loop: prefetched coroutines wait on its semaphore and
        start the moment a slot frees."""
        job_time = self._async_job_time
        if job_time is None:
            return 0
        return min(
            self.async_concurrency,
            int(self.async_concurrency * PREFETCH_COVER / max(job_time, 1e-4)),
        )

    def _claimable(self) -> int:
        """How many jobs the next claim may take: free thread slots plus prefetch, free
        async slots, at most --batch, none while too many outcomes wait to be written,
        and no more than --max-jobs leaves."""
        with self._lock:
            busy_sync, busy_async = self._busy_sync, self._busy_async
            unwritten = len(self.inflight) - busy_sync - busy_async
        if unwritten >= self.max_unwritten:
            return 0
        sync_part = max(0, self.concurrency + self._prefetch() - busy_sync)
        if self._async is not None:
            # A claim cannot choose sync or async jobs: size it for the kind the last
            # claim brought (jobs of the other kind in it run all the same), so
            # neither kind is hoarded for the other's free slots.
            async_part = max(0, self.async_concurrency + self._async_prefetch() - busy_async)
            if self._claim_kind == "async":
                sync_part = async_part
            elif self._claim_kind == "mixed":
                sync_part += async_part
        want = min(
            sync_part,
            self.batch if self._claim_kind != "async" else max(self.batch, self.async_concurrency),
        )
        if self.max_jobs is not None:
            want = min(want, self.max_jobs - self.claimed_count)
        return want

    def _leave_slot(self, entry: InFlight) -> None:
        """Under ``self._lock``: ``entry`` no longer occupies a thread or loop slot."""
        if entry.is_async:
            self._busy_async -= 1
        else:
            self._busy_sync -= 1

    def _drain(self, pool: JobRunners[InFlight]) -> bool:
        """Give prefetched jobs back at once; wait for running jobs and unwritten
        outcomes up to SHUTDOWN_TIMEOUT; then release what still runs."""
        connection = connections[self.alias]
        with self._lock:
            waiting = [e for e in self.inflight.values() if e.is_async and e.state == "queued"]
        give_back = self._take_back(pool.take_queued() + waiting)
        self._release(connection, give_back)
        deadline = time.monotonic() + (self.shutdown_timeout if self._stop.is_set() else 1e9)
        while self.inflight and time.monotonic() < deadline:
            self._wakeup.wait(0.05)
            self._wakeup.clear()
            with self._lock:
                if all(e.state not in ("queued", "running") for e in self.inflight.values()):
                    break  # only outcomes waiting for the completer are left
        with self._lock:
            leftovers = [e for e in self.inflight.values() if e.state in ("queued", "running")]
        self._release(connection, self._take_back(leftovers))
        return not leftovers

    def _take_back(self, entries: list[InFlight]) -> list[InFlight]:
        """Mark ``entries`` released (those not finished meanwhile); cancel their runs."""
        taken: list[InFlight] = []
        with self._lock:
            for entry in entries:
                if entry.state in ("queued", "running"):
                    entry.state = "released"
                    self._leave_slot(entry)
                    taken.append(entry)
        for entry in taken:
            entry.context.cancel()
            if entry.is_async and self._async is not None:
                self._async.cancel(entry.claimed.id)
        return taken

    def _release(self, connection: Any, entries: list[InFlight]) -> None:
        for entry in entries:
            claimed = entry.claimed
            try:
                ok = sql.release(connection, id=claimed.id, lease=claimed.lease)
            except DB_ERRORS as exc:
                logger.warning("could not release job %s (the reaper will): %s", claimed.id, exc)
                connection.close()
                ok = None
            with self._lock:
                self.inflight.pop(claimed.id, None)
                if ok is None:
                    self.unwritten += 1
            if ok is None:
                continue
            if ok:
                self.counts["released"] += 1
                logger.warning(
                    "released job %s (%s) unfinished at shutdown; attempt not counted",
                    claimed.id,
                    claimed.task,
                )
                signals.send(signals.job_released, **outcomes.signal_args(claimed, self.id))
            else:
                # A zombie's release: fenced like every other write, so say so.
                self.counts["fenced"] += 1
                outcomes.report_fenced(claimed, "release", worker=self.id)

    # ------------------------------------------------------------------ running jobs

    def _start(self, entry: InFlight) -> bool:
        with self._lock:
            if entry.state != "queued":
                return False  # released at shutdown before it started
            entry.state = "running"
            entry.thread = threading.current_thread()
            entry.started = time.monotonic()
            if entry.timeout is not None:
                entry.deadline = entry.started + entry.timeout
        claimed = entry.claimed
        if signals.job_started.receivers:
            signals.send(signals.job_started, **outcomes.signal_args(claimed, self.id))
        return True

    def _run_job(self, entry: InFlight) -> None:
        try:
            if not self._start(entry):
                return
            outcome = execute(
                entry.claimed, worker=self.id, alias=self.alias, context=entry.context
            )
        except BaseException as exc:  # noqa: BLE001 - execute() should not raise; be safe
            outcome = executor.last_resort(entry.claimed, exc, self.id)
        finally:
            try:
                # User code may have broken or left open its connection.
                connections[self.alias].close_if_unusable_or_obsolete()
            except BaseException:
                logger.exception("could not clean up the job thread's connection")
        self._finished(entry, outcome)

    async def _run_async(self, entry: InFlight) -> None:
        if not self._start(entry):
            return
        try:
            outcome = await executor.aexecute(
                entry.claimed, worker=self.id, alias=self.alias, context=entry.context
            )
        except BaseException as exc:  # noqa: BLE001 - cancelled: timeout or shutdown
            import asyncio

            if isinstance(exc, asyncio.CancelledError) and entry.state != "running":
                return  # the watchdog or the shutdown already dealt with it
            outcome = executor.last_resort(entry.claimed, exc, self.id)
        self._finished(entry, outcome)

    def _finished(self, entry: InFlight, outcome: Outcome) -> None:
        """The handler returned: free its slot now; the completer writes the outcome."""
        elapsed = time.monotonic() - entry.started
        with self._lock:
            if entry.state != "running":
                late = entry.state == "timed_out"
            else:
                late = False
                entry.state = "done"
                self._leave_slot(entry)
        if entry.state != "done":
            if late:
                logger.warning(
                    "job %s (%s): the run abandoned after its timeout returned "
                    "after %.1fs; its outcome is discarded",
                    entry.claimed.id,
                    entry.claimed.task,
                    elapsed,
                )
            return
        if entry.is_async:
            previous = self._async_job_time
            self._async_job_time = elapsed if previous is None else previous * 0.9 + elapsed * 0.1
        else:
            previous = self._job_time
            self._job_time = elapsed if previous is None else previous * 0.9 + elapsed * 0.1
        self._done.put((entry, outcome))
        self._wakeup.set()

    # ------------------------------------------------------------------ timeouts

    def _watchdog(self) -> None:
        while not self._threads_stop.wait(WATCHDOG_INTERVAL):
            try:
                self._expire(time.monotonic())
            except BaseException:  # the watchdog must not die
                logger.exception("timeout watchdog error")

    def _expire(self, now: float) -> None:
        expired: list[InFlight] = []
        with self._lock:
            for entry in self.inflight.values():
                if (
                    entry.state == "running"
                    and entry.deadline is not None
                    and entry.deadline <= now
                ):
                    entry.state = "timed_out"
                    self._leave_slot(entry)
                    expired.append(entry)
        for entry in expired:
            claimed = entry.claimed
            entry.context.cancel()
            if entry.is_async:
                if self._async is not None:
                    self._async.cancel(claimed.id)
            elif entry.thread is not None and self._pool is not None:
                self._pool.abandon(entry.thread)
            if entry.timeout is None:
                raise RuntimeError("a job without a timeout passed its deadline")
            logger.warning(
                "job %s (%s, attempt %s/%s) exceeded its timeout of %gs; giving up on it%s",
                claimed.id,
                claimed.task,
                claimed.attempt,
                claimed.max_attempts,
                entry.timeout,
                "" if entry.is_async else " (its thread is abandoned; a new one takes its place)",
                extra=outcomes.log_extra(claimed, self.id),
            )
            self._done.put((entry, executor.timed_out(claimed, entry.timeout, self.id)))
        if expired:
            self._wakeup.set()
        if self._pool is not None and self.restart_reason is None:
            abandoned = self._pool.abandoned_alive
            if abandoned > self.max_abandoned:
                self.restart_reason = (
                    f"{abandoned} threads abandoned by timed-out jobs are still running "
                    f"(more than {self.max_abandoned}); restarting to get rid of them"
                )
                logger.error("worker %s: %s", self.id, self.restart_reason)
                self.request_stop()

    # ------------------------------------------------------------------ completer

    def _completer(self) -> None:
        backoff = Backoff("completion connection")
        connection = connections[self.alias]
        finished = False
        try:
            while not finished:
                item = self._done.get()
                batch: list[tuple[InFlight, Outcome]] = []
                if item is None:
                    finished = True
                else:
                    batch.append(item)
                while True:
                    try:
                        more = self._done.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        finished = True
                    else:
                        batch.append(more)
                try:
                    self._write_batch(connection, batch, backoff)
                except BaseException:  # the completer never dies
                    logger.exception(
                        "completer: unexpected error; %d outcomes are left to the reaper",
                        len(batch),
                    )
                    self._forget(batch)
        finally:
            connection.close()

    def _write_batch(
        self, connection: Any, batch: list[tuple[InFlight, Outcome]], backoff: Backoff
    ) -> None:
        """Write and report every outcome of ``batch`` exactly once. Connection errors:
        back off and retry the rest (the statements recognise their own committed
        writes). Any other error: fall back to one row at a time, so the row that
        causes it fails alone."""
        todo = list(batch)
        per_row = False
        redo = False  # the first try cannot meet a committed run of itself
        while todo:
            try:
                if per_row:
                    self._write_rows(connection, todo)
                else:
                    self._write_outcomes(connection, todo, redo=redo)
                backoff.succeeded()
            except CONNECTION_ERRORS as exc:
                # Keep the rest: a completion is never dropped on a DB blip.
                backoff.failed(exc)
                connection.close()
                time.sleep(backoff.delay())
            except BaseException as exc:  # a data error or a bad value
                if per_row:
                    raise
                logger.warning(
                    "writing a batch of %d outcomes failed (%s: %s); writing them one by one",
                    len(todo),
                    type(exc).__name__,
                    exc,
                )
                per_row = True
            redo = True
        self._wakeup.set()

    def _write_outcomes(
        self, connection: Any, todo: list[tuple[InFlight, Outcome]], *, redo: bool = True
    ) -> None:
        """Batched (``outcomes.write_batch``); removes and reports each as it is written."""
        items = list(todo)
        pairs = [(e.claimed, o) for e, o in items]
        for index, ok in outcomes.write_batch(connection, pairs, redo=redo):
            entry, outcome = items[index]
            todo.remove(items[index])
            self._reported(entry, outcome, ok)

    def _write_rows(self, connection: Any, todo: list[tuple[InFlight, Outcome]]) -> None:
        """One row at a time; a row whose write fails with a data error is
        dead-lettered with that error (or, failing that too, left to the reaper)."""
        for item in list(todo):
            entry, outcome = item
            ok: bool | None
            try:
                ok = outcomes.write(connection, entry.claimed, outcome)
            except CONNECTION_ERRORS:
                raise
            except BaseException as exc:  # noqa: BLE001
                outcome, ok = self._write_failed(connection, entry, outcome, exc)
            todo.remove(item)
            if ok is None:
                self._forget([item])
            else:
                self._reported(entry, outcome, ok)

    def _write_failed(
        self, connection: Any, entry: InFlight, outcome: Outcome, exc: BaseException
    ) -> tuple[Outcome, bool | None]:
        claimed = entry.claimed
        logger.error(
            "job %s (%s): its %s outcome could not be written (%s: %s); dead-lettering it",
            claimed.id,
            claimed.task,
            outcome.kind,
            type(exc).__name__,
            exc,
            extra=outcomes.log_extra(claimed, self.id),
        )
        failure = RuntimeError(
            f"the {outcome.kind} outcome of job {claimed.id} could not be written: "
            f"{type(exc).__name__}: {exc}"
        )
        dead = Outcome(
            "dead", error=executor.error_entry(claimed.attempt, failure, self.id), exception=failure
        )
        # The same dead-letter with an error entry reduced to plain words, in case
        # something in the first one is what the database refuses.
        bare = Outcome(
            "dead",
            error={
                "attempt": claimed.attempt,
                "type": "builtins.RuntimeError",
                "message": "the outcome could not be written",
                "worker": self.id,
            },
            exception=failure,
        )
        for attempt in (dead, bare):
            try:
                return dead, outcomes.write(connection, claimed, attempt)
            except CONNECTION_ERRORS:
                raise
            except BaseException as again:  # noqa: BLE001
                logger.error("job %s: dead-lettering failed too: %s", claimed.id, again)
        return dead, None

    def _reported(self, entry: InFlight, outcome: Outcome, ok: bool) -> None:
        claimed = entry.claimed
        outcomes.report(claimed, outcome, ours=ok, worker=self.id)
        if outcome.extra.get("timed_out") and ok:
            self.counts["timed_out"] += 1
        self.counts[outcome.kind if ok else "fenced"] += 1
        with self._lock:
            self.inflight.pop(claimed.id, None)

    def _forget(self, batch: list[tuple[InFlight, Outcome]]) -> None:
        """Stop tracking (and heartbeating) jobs whose outcome cannot be written: the
        reaper reclaims them after STALE_AFTER."""
        with self._lock:
            for entry, _ in batch:
                if self.inflight.pop(entry.claimed.id, None) is not None:
                    self.unwritten += 1
        self._wakeup.set()

    # ------------------------------------------------------------------ heartbeat

    def _heartbeat(self) -> None:
        backoff = Backoff("heartbeat connection")
        connection = connections[self.alias]
        try:
            while not self._threads_stop.wait(self.heartbeat_interval):
                with self._lock:
                    items = [(e.claimed.id, e.claimed.lease) for e in self.inflight.values()]
                try:
                    lost = sql.heartbeat(connection, items)
                    with connection.cursor() as cursor:
                        cursor.execute(sql.WORKER_UPSERT, self._worker_row())
                    backoff.succeeded()
                except BaseException as exc:  # noqa: BLE001 - the heartbeat must not die
                    backoff.failed(exc)
                    connection.close()
                    continue
                for job_id in lost:
                    entry = self.inflight.get(job_id)
                    if entry is None or entry.context.is_cancelled():
                        continue
                    entry.context.cancel()
                    outcomes.report_fenced(
                        entry.claimed,
                        "heartbeat",
                        worker=self.id,
                        consequence="; its result will be rejected",
                    )
        finally:
            connection.close()

    # ------------------------------------------------------------------ Worker row

    def _worker_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": json.dumps(self.queues or ["*"]),
            "concurrency": self.concurrency,
            "tasks": json.dumps(self.flow.tasks),
        }

    def _register_worker(self) -> None:
        try:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(sql.WORKER_UPSERT, self._worker_row())
        except DB_ERRORS as exc:
            logger.warning("could not register worker row (will retry with heartbeats): %s", exc)
            connections[self.alias].close()

    def _unregister_worker(self) -> None:
        try:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(sql.WORKER_DELETE, [self.id])
        except DB_ERRORS:
            connections[self.alias].close()
