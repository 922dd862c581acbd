"""Background services every ``runjobs`` process runs at their intervals.

Each service has ``name``, ``interval`` (seconds) and ``run_once()``. Passes are
idempotent and safe on many hosts at once, so no leader is elected: running
them everywhere only costs a few cheap queries.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Protocol

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.maintenance.cron import CronTicker, usable_schedules
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.maintenance.reaper import Reaper
from django_pgjobs.maintenance.rollup import Rollup
from django_pgjobs.maintenance.statistics import TableStatistics
from django_pgjobs.maintenance.unknown_tasks import UnknownTaskSweeper
from django_pgjobs.maintenance.wakes import WakePass
from django_pgjobs.maintenance.workflow_repair import WorkflowRepair
from django_pgjobs.support.throttle import Backoff

logger = logging.getLogger("django_pgjobs")

#: A pass that stopped at its time budget with work left (it returns
#: ``{"complete": False, ...}``: the pruner behind a high rate) is due again after at
#: most this many seconds instead of its interval: a worker's pruner then keeps up with
#: thousands of jobs a second, in passes still short enough for the services beside it.
BEHIND_INTERVAL = 10.0


class Service(Protocol):
    name: str
    interval: float

    def run_once(self) -> dict[str, Any]: ...


def default_services(*, alias: str, worker: str) -> list[Service]:
    """The services a worker runs: the reaper, the pruner, (built-in engine) the cron
    ticker, the unknown-task sweeper, the workflow repair pass, the minute rollup and the
    statistics pass, and the wake pass of durable jobs."""
    services: list[Service] = [Reaper(alias=alias, worker=worker)]
    # Durable jobs whose sleep ended, or whose wait timed out, back to pending.
    services.append(WakePass(alias=alias))
    # A pass of at most 2 s, so the reaper and the ticker sharing this thread stay on time.
    services.append(Pruner(alias=alias, time_budget=2.0))
    if get_settings().CRON_ENGINE == "builtin":
        schedules = usable_schedules()  # a bad schedule is logged, the others tick
        if schedules:
            services.append(CronTicker(alias=alias, schedules=schedules))
    # Deploy skew: dead-letter jobs no live worker has known for UNKNOWN_TASK_TIMEOUT.
    services.append(UnknownTaskSweeper(alias=alias))
    # Workflows: what the release trigger could not do (rows written with it off).
    services.append(WorkflowRepair(alias=alias))
    # Finished jobs counted per minute, for the pages that show the last hour.
    services.append(Rollup(alias=alias))
    # Fresh statistics, so cached plans are made again, when the jobs table outgrew them.
    services.append(TableStatistics(alias=alias))
    return services


def maintenance_threads(
    services: list[Service], stop: threading.Event, alias: str
) -> list[MaintenanceThread]:
    """The reaper in a thread (and on a connection) of its own, the other passes in
    another: a pass that waits on a lock, for a worker frozen inside its transaction
    say, must not hold up the reclaiming of that very worker's jobs (a rollup pass once
    did, tests/db/test_rollup.py)."""
    reaping = [s for s in services if s.name == Reaper.name]
    others = [s for s in services if s.name != Reaper.name]
    threads = [MaintenanceThread(reaping, stop, alias, name="pgjobs-reaper")] if reaping else []
    if others:
        threads.append(MaintenanceThread(others, stop, alias))
    return threads


class MaintenanceThread(threading.Thread):
    """Runs each service when due; a failing pass is logged and retried next interval."""

    def __init__(
        self,
        services: list[Service],
        stop: threading.Event,
        alias: str,
        *,
        name: str = "pgjobs-maintenance",
        behind_interval: float = BEHIND_INTERVAL,
    ):
        super().__init__(name=name, daemon=True)
        self.services = services
        self.stop = stop
        self.alias = alias
        self.behind_interval = behind_interval

    def run(self) -> None:
        # Stagger the first pass so replicas started together do not run in lockstep.
        due = {
            s.name: time.monotonic() + random.uniform(0, min(s.interval, 1.0))
            for s in self.services
        }
        backoffs = {s.name: Backoff(s.name) for s in self.services}
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                for service in self.services:
                    if now < due[service.name]:
                        continue
                    wait = service.interval
                    try:
                        if service.run_once().get("complete") is False:
                            wait = min(wait, self.behind_interval)
                        backoffs[service.name].succeeded()
                    except Exception as exc:  # noqa: BLE001
                        backoffs[service.name].failed(exc)
                        connections[self.alias].close()
                    due[service.name] = time.monotonic() + wait * random.uniform(0.9, 1.1)
                self.stop.wait(max(0.05, min(due.values()) - time.monotonic()))
        finally:
            connections[self.alias].close()
