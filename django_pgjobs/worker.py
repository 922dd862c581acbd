"""The worker: claims jobs, runs them on a thread pool, writes their outcomes.

Threads, each with its own database connection:

* main: the claim loop. Claims up to the free slots (``--batch`` at most) in one
  round trip, hands jobs to the pool, then sleeps until a NOTIFY, a freed slot or
  the jittered poll timeout;
* pool: runs handlers (user code, so Django connections are cleaned after each job);
* completer: batches completions into one statement and writes retries/dead
  letters; frees slots;
* heartbeat: refreshes all in-flight jobs in one statement, notices lost leases
  (cancel, reaper) and keeps the ``Worker`` row fresh;
* listener (LISTEN), maintenance (reaper and friends).

No transaction stays open while a job runs, except inside ``@job(atomic=True)``.
"""

from __future__ import annotations

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
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from . import flow, outcomes, signals, sql
from .conf import get_settings
from .context import JobContext
from .executor import Outcome, execute, make_context
from .listener import Listener
from .maintenance import MaintenanceThread, Service, default_services
from .runners import JobRunners
from .throttle import Backoff

logger = logging.getLogger("django_pgjobs")

DB_ERRORS = (OperationalError, InterfaceError, DatabaseError)

#: Longest a saturated worker waits for more free slots before a claim (seconds).
GATHER_WAIT = 0.005


@dataclass
class InFlight:
    claimed: sql.Claimed
    context: JobContext


def make_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """One ``runjobs`` process. ``run()`` returns the exit code."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 8,
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
    ):
        conf = get_settings()
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.batch = batch or conf.BATCH_SIZE
        # A busy worker waits (at most GATHER_WAIT) until this many slots are free
        # before claiming again, so claims stay batches instead of 1-2 rows each.
        self.min_claim = max(1, min(self.batch, concurrency) // 4)
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
            services if services is not None
            else default_services(alias=self.alias, worker=self.id) if maintenance else []
        )

        # Flow control and deploy skew: claim only known tasks, honour queue limits.
        self.flow = flow.FlowState(self.queues)
        self.inflight: dict[int, InFlight] = {}
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stop = threading.Event()        # stop claiming
        self._threads_stop = threading.Event()  # stop helper threads
        self._done: queue.SimpleQueue[tuple[InFlight, Outcome] | None] = queue.SimpleQueue()
        self._signals_seen = 0
        self.claimed_count = 0
        self.finished_count = 0
        self.counts = {"completed": 0, "retry": 0, "dead": 0, "fenced": 0, "released": 0}

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
                "send it again to exit at once", self.id, signal.Signals(signum).name,
                len(self.inflight), self.shutdown_timeout)
            self.request_stop()
        else:
            logger.warning("worker %s: second signal, exiting at once; the reaper will "
                           "reclaim %d in-flight jobs", self.id, len(self.inflight))
            os._exit(1)

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        logger.info("worker %s starting: queues=%s concurrency=%d batch=%d listen=%s burst=%s",
                    self.id, ",".join(self.queues) if self.queues else "*", self.concurrency,
                    self.batch, self.listen, self.burst)
        pool: JobRunners[InFlight] = JobRunners(self.concurrency, self._run_job, "pgjobs-job")
        helpers: list[threading.Thread] = [
            threading.Thread(target=self._completer, name="pgjobs-completer", daemon=True),
            threading.Thread(target=self._heartbeat, name="pgjobs-heartbeat", daemon=True),
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
            helpers[0].join(timeout=10)
            self._unregister_worker()
            connections[self.alias].close()
        pool.shutdown(wait=clean, cancel_pending=True)
        logger.info("worker %s stopped: %s", self.id, self.counts)
        return 0

    def _on_notify(self, payload: str) -> None:
        if payload == flow.QUEUES_CHANGED:
            self.flow.invalidate()  # a queue was paused, resumed or edited
        if not payload or self.queues is None or payload in self.queues:
            self._wakeup.set()

    def _claim_loop(self, pool: JobRunners[InFlight]) -> None:
        backoff = Backoff("claim connection")
        connection = connections[self.alias]
        while not self._stop.is_set():
            self._wakeup.clear()
            want = self._claimable()
            if want <= 0 and self.max_jobs is not None and not self.inflight:
                break
            if 0 < want < self.min_claim and self.inflight:
                want = self._gather_slots(want)
            got = 0
            if want > 0:
                try:
                    claimed = self.flow.claim(connection, worker=self.id, n=want)
                    backoff.succeeded()
                except DB_ERRORS as exc:
                    backoff.failed(exc)
                    connection.close()
                    self._stop.wait(backoff.delay())
                    continue
                got = len(claimed)
                self.claimed_count += got
                entries = [InFlight(c, make_context(c, self.id)) for c in claimed]
                with self._lock:
                    for entry in entries:
                        self.inflight[entry.claimed.id] = entry
                for entry in entries:
                    pool.submit(entry)
                if got == want:
                    continue  # there may be more due work: claim again at once
            if self.burst and got == 0 and not self.inflight:
                break
            # Idle or full: sleep until NOTIFY, a freed slot, or the jittered poll.
            self._wakeup.wait(self.poll_interval * random.uniform(0.8, 1.2))

    def _gather_slots(self, want: int) -> int:
        """Saturated: wait up to GATHER_WAIT for ``min_claim`` free slots (a profile of
        no-op drains showed claims of 1-2 rows each, one round trip per job)."""
        deadline = time.monotonic() + GATHER_WAIT
        while want < self.min_claim and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not self.inflight:
                break
            self._wakeup.wait(left)
            self._wakeup.clear()
            want = self._claimable()
        return want

    def _claimable(self) -> int:
        """How many jobs the next claim may take: free slots, at most --batch, and
        no more than --max-jobs leaves."""
        want = min(self.concurrency - len(self.inflight), self.batch)
        if self.max_jobs is not None:
            want = min(want, self.max_jobs - self.claimed_count)
        return want

    def _drain(self, pool: JobRunners[InFlight]) -> bool:
        """Wait for in-flight jobs up to SHUTDOWN_TIMEOUT, then release the rest."""
        deadline = time.monotonic() + (self.shutdown_timeout if self._stop.is_set() else 1e9)
        while self.inflight and time.monotonic() < deadline:
            self._wakeup.wait(0.05)
            self._wakeup.clear()
        if not self.inflight:
            return True
        connection = connections[self.alias]
        with self._lock:
            leftovers = list(self.inflight.values())
        for entry in leftovers:
            try:
                ok = sql.release(connection, id=entry.claimed.id, lease=entry.claimed.lease)
            except DB_ERRORS as exc:
                logger.warning("could not release job %s (the reaper will): %s",
                               entry.claimed.id, exc)
                continue
            entry.context.cancel()
            if ok:
                self.counts["released"] += 1
                logger.warning("released job %s (%s) unfinished at shutdown; attempt not counted",
                               entry.claimed.id, entry.claimed.task)
            else:
                # A zombie's release: fenced like every other write, so say so.
                self.counts["fenced"] += 1
                outcomes.report_fenced(entry.claimed, "release", worker=self.id)
        return False

    # ------------------------------------------------------------------ job threads

    def _run_job(self, entry: InFlight) -> None:
        claimed = entry.claimed
        try:
            if signals.job_started.receivers:
                signals.send(signals.job_started, job_id=claimed.id, task=claimed.task,
                             attempt=claimed.attempt, lease=claimed.lease, worker=self.id)
            outcome = execute(claimed, worker=self.id, alias=self.alias, context=entry.context)
        except BaseException as exc:  # noqa: BLE001 - execute() should not raise; be safe
            from .executor import error_entry

            outcome = Outcome("retry", error=error_entry(claimed.attempt, exc, self.id), exception=exc)
        finally:
            # User code may have broken or left open its connection.
            connections[self.alias].close_if_unusable_or_obsolete()
        self._done.put((entry, outcome))

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
                while batch:
                    try:
                        self._write_outcomes(connection, batch)
                        backoff.succeeded()
                        batch = []
                    except DB_ERRORS as exc:
                        # Keep the batch: a completion is never dropped on a DB blip.
                        backoff.failed(exc)
                        connection.close()
                        time.sleep(backoff.delay())
        finally:
            connection.close()

    def _write_outcomes(self, connection: Any, batch: list[tuple[InFlight, Outcome]]) -> None:
        to_complete = [(e, o) for e, o in batch if o.kind == "completed" and not o.written]
        ours: set[int] = set()
        if to_complete:
            ours = sql.complete_many(connection, [
                (e.claimed.id, e.claimed.lease, o.value) for e, o in to_complete])
        for entry, outcome in batch:
            claimed = entry.claimed
            if outcome.kind == "completed" and not outcome.written:
                ok = claimed.id in ours
            else:
                ok = outcomes.write(connection, claimed, outcome)
            outcomes.report(claimed, outcome, ours=ok, worker=self.id)
            self.counts[outcome.kind if ok else "fenced"] += 1
            with self._lock:
                self.inflight.pop(claimed.id, None)
            self.finished_count += 1
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
                except DB_ERRORS as exc:
                    backoff.failed(exc)
                    connection.close()
                    continue
                for job_id in lost:
                    entry = self.inflight.get(job_id)
                    if entry is None or entry.context.is_cancelled():
                        continue
                    entry.context.cancel()
                    outcomes.report_fenced(entry.claimed, "heartbeat", worker=self.id,
                                           consequence="; its result will be rejected")
        finally:
            connection.close()

    # ------------------------------------------------------------------ Worker row

    def _worker_row(self) -> dict[str, Any]:
        import json

        return {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": json.dumps(self.queues or ["*"]), "concurrency": self.concurrency,
                "tasks": json.dumps(self.flow.tasks)}

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
