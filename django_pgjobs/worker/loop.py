"""The Worker: one worker's parts, put together and run. It claims jobs, runs them
and writes their outcomes, pipelined, each duty in a module of its own:

* ``claimer``: the claim loop, on the calling (main) thread; at shutdown it gives
  back what has not started;
* ``running``: ``--concurrency`` job threads for ``def`` jobs, one event loop for
  ``async def`` jobs (``--async-concurrency`` at once);
* ``completer``: a thread that batches outcomes into few statements. A slot is free
  the moment its handler returns; outcomes waiting to be written are tracked
  (heartbeated, written before exit) separately, and bounded;
* ``heartbeat``: a thread that refreshes every claimed job in one statement, notices
  lost leases (cancel, reaper) and keeps the ``Worker`` row fresh; a heartbeat
  process (``pulse_link``) does the same while the thread cannot (a job holding
  the GIL);
* ``watchdog``: a thread that gives up on runs past their timeout;
* ``inflight``: the table they share, of every job claimed and not yet written;
* ``listener`` (LISTEN) and maintenance (reaper and friends), threads too.

Each thread has its own database connection and survives any exception from the
code it runs: a job that breaks the worker's own machinery fails alone, with a
clear error entry. No transaction stays open while a job runs, except inside
``@job(atomic=True)``. What a ``runjobs`` process adds around a Worker (signals,
restart, metrics, health file) is ``management/worker_process.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from django.db import connections

from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.claim.front import SWEEP_EVERY, UNPROBED_AFTER, ClaimFront
from django_pgjobs.claim.probe import FrontProbe
from django_pgjobs.conf import get_settings
from django_pgjobs.jobs import registry
from django_pgjobs.maintenance.services import Service, default_services, maintenance_threads
from django_pgjobs.queues import sync_queues_quietly
from django_pgjobs.worker import connection_pool
from django_pgjobs.worker.chunks import ChunkFill
from django_pgjobs.worker.claimer import Claimer, ClaimSize
from django_pgjobs.worker.completer import Completer
from django_pgjobs.worker.heartbeat import Heartbeat, WorkerRow, make_worker_id
from django_pgjobs.worker.inflight import InFlightTable
from django_pgjobs.worker.listener import Listener
from django_pgjobs.worker.pulse_link import PulseLink
from django_pgjobs.worker.running import JobRuns
from django_pgjobs.worker.watchdog import Watchdog

logger = logging.getLogger("django_pgjobs")

#: Defaults of ``runjobs`` (chosen by measurement; docs/explanation/performance.md).
DEFAULT_CONCURRENCY = 16
DEFAULT_ASYNC_CONCURRENCY = 100


class Worker:
    """One worker. ``run()`` returns the exit code: 0 when every job it claimed was
    written or released, 1 when some could not be (their outcome or release failed)
    and are left to the reaper. ``restart_reason`` is set when the worker stopped
    itself to be restarted (abandoned threads)."""

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
        max_abandoned: int | None = None,
        shutdown_timeout: float | None = None,
        heartbeat_process: bool | None = None,
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
        self.max_abandoned = concurrency if max_abandoned is None else max_abandoned
        self.listen = conf.LISTEN if listen is None else listen
        self.alias = alias or conf.DATABASE
        self.id = worker_id or make_worker_id()
        self.shutdown_timeout = (
            conf.SHUTDOWN_TIMEOUT if shutdown_timeout is None else shutdown_timeout
        )
        self.services = (
            services
            if services is not None
            else default_services(alias=self.alias, worker=self.id)
            if maintenance
            else []
        )
        # timed_out: runs given up on (each also counted as retry or dead)
        self.counts = dict.fromkeys(
            ("completed", "retry", "dead", "fenced", "released", "waiting", "timed_out"), 0
        )
        self.inflight = InFlightTable()
        poll = conf.POLL_INTERVAL if poll_interval is None else poll_interval
        # Claims start past the jobs already claimed (claim/front.py); not in burst
        # mode, whose empty claim ends the run: that claim reads the whole index.
        # With LISTEN and maintenance, a probe on the maintenance thread finds the jobs
        # before the bound that no NOTIFY announced, and the priorities past it (the
        # claims seek each from the bound), instead of a claim every 10 s.
        probing = maintenance and self.listen and not burst
        front = (
            None
            if burst
            else ClaimFront(UNPROBED_AFTER if probing else SWEEP_EVERY if self.listen else poll)
        )
        # The worker's claims, behind one call: flow control and deploy skew (claim
        # only known tasks, honour queue limits) and the front.
        self.claimant = Claimant(self.queues, worker=self.id, front=front, notified=self.listen)
        if probing and front is not None:
            self.services = [
                *self.services,
                FrontProbe(front=front, scope=self.claimant.probe_scope, alias=self.alias),
            ]
        self.claimer = Claimer(
            worker_id=self.id,
            alias=self.alias,
            table=self.inflight,
            size=ClaimSize(
                concurrency=concurrency, async_concurrency=async_concurrency, batch=self.batch
            ),
            claimant=self.claimant,
            counts=self.counts,
            burst=burst,
            max_jobs=max_jobs,
            poll_interval=poll,
            shutdown_timeout=self.shutdown_timeout,
            late_after=conf.HEARTBEAT_INTERVAL,
        )
        self.completer = Completer(
            table=self.inflight,
            counts=self.counts,
            wake=self.claimer.wake,
            worker_id=self.id,
            alias=self.alias,
        )
        self.row = WorkerRow(self.id, self.queues, concurrency, self.claimant.tasks)
        self.heartbeat = Heartbeat(
            jobs=self.inflight, row=self.row, alias=self.alias, interval=conf.HEARTBEAT_INTERVAL
        )
        if conf.HEARTBEAT_PROCESS if heartbeat_process is None else heartbeat_process:
            # beats for the thread while it cannot (a job holding the GIL): see
            # docs/explanation/guarantees.md
            pulse = PulseLink(
                worker_id=self.id,
                on_lost=self.heartbeat.lost_elsewhere,
                leases=self.inflight.leases,
            )
            self.heartbeat.pulse = pulse
            self.inflight.on_add = pulse.added
            self.row.degraded = lambda: pulse.degraded
        self.watchdog: Watchdog | None = None  # made by run(), with the job runners
        self._threads_stop = threading.Event()  # stop the helper threads

    @property
    def claimed_count(self) -> int:
        return self.claimer.claimed_count

    @property
    def unwritten(self) -> int:
        """Jobs whose outcome or release could not be written, left to the reaper."""
        return self.inflight.unwritten

    @property
    def restart_reason(self) -> str | None:
        return None if self.watchdog is None else self.watchdog.restart_reason

    def request_stop(self) -> None:
        """Graceful: stop claiming; in-flight jobs get SHUTDOWN_TIMEOUT to finish."""
        self.claimer.request_stop()

    def run(self) -> int:
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
            self.claimer.burst,
        )
        runs = JobRuns(
            table=self.inflight,
            hand_over=self.completer.put,
            observe=self.claimer.size.observe,
            wake=self.claimer.wake,
            run_over=self.completer.run_over,
            worker_id=self.id,
            alias=self.alias,
            concurrency=self.concurrency,
            async_concurrency=self.async_concurrency,
            use_async=use_async,
        )
        chunk_fill = ChunkFill(
            board=self.claimer.chunks,
            claimant=self.claimant,
            submit=runs.submit,
            worker_id=self.id,
            alias=self.alias,
            stopping=self.claimer.stopping,
            enabled=self.claimer.max_jobs is None,  # --max-jobs counts every claim
        )
        runs.fill, runs.close_chunk = chunk_fill.fill, self.claimer.chunks.close
        self.watchdog = Watchdog(
            table=self.inflight,
            runs=runs,
            hand_over=self.completer.put,
            wake=self.claimer.wake,
            stop_worker=self.request_stop,
            max_abandoned=self.max_abandoned,
            worker_id=self.id,
        )
        stop = self._threads_stop
        watchdog = threading.Thread(
            target=self.watchdog.run, args=(stop,), name="pgjobs-watchdog", daemon=True
        )
        helpers: list[threading.Thread] = [
            threading.Thread(target=self.completer.run, name="pgjobs-completer", daemon=True),
            threading.Thread(
                target=self.heartbeat.run, args=(stop,), name="pgjobs-heartbeat", daemon=True
            ),
            watchdog,
        ]
        if self.listen:
            helpers.append(Listener(self.alias, self.claimer.on_notify, stop))
        maintenance = maintenance_threads(self.services, stop, self.alias)
        helpers.extend(maintenance)
        # Before the first connection: a pool narrower than the threads would starve them.
        connection_pool.fit_pool(
            self.alias,
            jobs=self.concurrency,
            abandoned=self.max_abandoned,
            own=connection_pool.own_connections(maintenance=len(maintenance), use_async=use_async),
        )
        self.row.register(self.alias)
        self.heartbeat.start_pulse()
        sync_queues_quietly(self.alias)
        for thread in helpers:
            thread.start()
        try:
            self.claimer.claim_loop(runs)
            clean = self.claimer.drain(runs)
        finally:
            stop.set()
            # The watchdog before the completer closes: the drain waits for an outcome
            # not yet on the completer's queue (InFlight.handed) only until its
            # deadline, and a timeout the watchdog hands over after the close would be
            # left to the reaper.
            self._join([watchdog])
            self.completer.close()
            # Every helper first: a heartbeat still running could re-create the
            # Worker row deleted below (the heartbeat process too).
            self._join(helpers)
            if self.heartbeat.pulse is not None:
                self.heartbeat.pulse.stop()
            self.row.unregister(self.alias)
            connections[self.alias].close()
        runs.stop(wait=clean)
        self.inflight.write_off_rest()  # the completer did not get to them
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
