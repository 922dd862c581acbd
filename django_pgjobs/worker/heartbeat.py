"""The heartbeat: how the rest of the system knows this worker is alive.

Every ``HEARTBEAT_INTERVAL`` one statement refreshes ``heartbeat_at`` of every job
the worker holds (each fenced by its lease), and the worker's row in
``django_pgjobs_worker`` is upserted (``jobs_status``, the admin, deploy skew and
the health file read it). A job whose refresh matched no row has lost its lease (a
cancel, the reaper, an admin retry): its context turns cancelled so a long job can
stop, and the loss is reported like every fenced write.

The reaper takes a job whose heartbeat is older than ``STALE_AFTER`` for dead, so
this is where the rule lives that a worker that is alive is never taken for dead
(docs/explanation/guarantees.md).
What the heartbeat needs from the worker is deliberately narrow (``JobLeases``:
which (id, lease) are in flight, and where to say a lease was lost), so it can beat
from elsewhere than the worker's own threads: the heartbeat process
(``django_pgjobs/pulse.py``, fed through ``pulse``) beats when this thread is late,
e.g. while a job holds the GIL, for the same jobs and for those claimed under this
worker's id that the claimer could not hand over yet (its claim's reply waits for
the GIL too). It never raises: a failed beat backs off, reconnects and tries again
at the next interval.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.db import connections

from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.store import (
    JOB_HEARTBEAT_PULSE,
    WORKER_UPSERT,
    job_heartbeat,
    worker_delete,
    worker_upsert,
)
from django_pgjobs.support.pgconn import psycopg_params, session_setup
from django_pgjobs.support.throttle import Backoff
from django_pgjobs.worker import outcomes
from django_pgjobs.worker.failure_kinds import DB_ERRORS
from django_pgjobs.worker.pulse_link import PulseLink

logger = logging.getLogger("django_pgjobs")


class JobLeases(Protocol):
    """What the heartbeat asks of the worker (the in-flight table answers)."""

    def leases(self) -> list[tuple[int, int]]:
        """(job id, lease) of every job in flight."""
        ...

    def lease_lost(self, job_id: int, lease: int) -> Claimed | None:
        """The job's ``lease`` moved on: cancel the run that held it. Its claim if
        that is news (None for a run that already ended, or a newer claim)."""
        ...


def make_worker_id() -> str:
    """``host:pid:random``: unique per run, and says where the worker runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class WorkerRow:
    """This worker's row in ``django_pgjobs_worker``."""

    id: str
    queues: Sequence[str] | None
    concurrency: int
    #: the task names this worker claims (deploy skew: ``maintenance/unknown_tasks.py``)
    tasks: Sequence[str]
    #: why it runs without its heartbeat process now (None: it has one, or none is wanted)
    degraded: Callable[[], str | None] | None = None

    def params(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": json.dumps(list(self.queues or ["*"])),
            "concurrency": self.concurrency,
            "tasks": json.dumps(list(self.tasks)),
            "degraded": (self.degraded() if self.degraded is not None else None) or "",
        }

    def register(self, alias: str) -> None:
        """Write the row at start (a failure is repaired by the first beat)."""
        try:
            with connections[alias].cursor() as cursor:
                worker_upsert(cursor, self.params())
        except DB_ERRORS as exc:
            logger.warning("could not register worker row (will retry with heartbeats): %s", exc)
            connections[alias].close()

    def unregister(self, alias: str) -> None:
        """Delete the row at exit, with the limit slots this worker still holds (its
        abandoned threads end with the process); only once the heartbeat has stopped,
        or a beat in progress would bring the row back."""
        try:
            with connections[alias].cursor() as cursor:
                worker_delete(cursor, self.id)
        except DB_ERRORS:
            connections[alias].close()


@dataclass(kw_only=True, eq=False)
class Heartbeat:
    """``run(stop)`` beats every ``interval`` seconds until ``stop`` is set."""

    jobs: JobLeases
    row: WorkerRow
    alias: str
    #: the heartbeat process, told after each beat (None: this thread alone)
    pulse: PulseLink | None = None
    #: seconds between beats (keyword-only fields: a required one may follow defaults)
    interval: float
    #: ``runjobs --health-file``: kept fresh by the heartbeat process after its beats
    #: too, for at most ``health_bound`` seconds of silence (``HEALTH_STUCK_AFTER``)
    health_file: str | None = None
    health_bound: float | None = None
    _reporting: threading.Lock = field(default_factory=threading.Lock, init=False)

    def start_pulse(self) -> None:
        """Start the heartbeat process with this heartbeat's statements and settings."""
        if self.pulse is None:
            return
        config = {
            "connection": psycopg_params(self.alias),
            "setup": session_setup(self.alias),
            "interval": self.interval,
            "heartbeat": JOB_HEARTBEAT_PULSE,
            "worker_upsert": WORKER_UPSERT,
            "worker_row": self.row.params(),
            "touch": self.health_file,
            "touch_for": self.health_bound,
        }
        if not self.pulse.start(config):
            self.pulse = None

    def run(self, stop: threading.Event) -> None:
        backoff = Backoff("heartbeat connection")
        connection = connections[self.alias]
        try:
            while not stop.wait(self.interval):
                try:
                    # The rows hold now() of the beat's start: the heartbeat process
                    # counts the worker's silence from there, not from when the beat
                    # ended (a beat slow under load must not look fresher than it is).
                    started = time.monotonic()
                    lost = self.beat(connection)
                    backoff.succeeded()
                    if self.pulse is not None:
                        self.pulse.beaten(self.jobs.leases, started)
                except BaseException as exc:  # noqa: BLE001 - the heartbeat must not die
                    backoff.failed(exc)
                    connection.close()
                    continue
                self.report_lost(lost)
        finally:
            connection.close()

    def beat(self, connection: Any) -> list[tuple[int, int]]:
        """Refresh every job in flight and the worker row; the (id, lease) pairs sent
        whose lease was lost."""
        sent = self.jobs.leases()
        lost = job_heartbeat(connection, sent)
        with connection.cursor() as cursor:
            worker_upsert(cursor, self.row.params())
        return [(job_id, lease) for job_id, lease in sent if job_id in lost]

    def report_lost(self, lost: Iterable[tuple[int, int]]) -> None:
        with self._reporting:  # this thread and the heartbeat process's reader
            for job_id, lease in lost:
                claimed = self.jobs.lease_lost(job_id, lease)
                if claimed is not None:
                    outcomes.report_fenced(
                        claimed,
                        "heartbeat",
                        worker=self.row.id,
                        consequence="; its result will be rejected",
                    )

    def lost_elsewhere(self, job_id: int, lease: int) -> None:
        """The heartbeat process found ``lease`` lost: cancels the run that held it
        only (``lease_lost`` checks the lease)."""
        self.report_lost([(job_id, lease)])
