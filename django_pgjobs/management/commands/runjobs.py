"""``manage.py runjobs``: parse options, build a Worker, run it. Behaviour lives in worker.py."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgjobs.conf import get_settings
from django_pgjobs.health import readiness
from django_pgjobs.health.probe import HealthFile
from django_pgjobs.management.selection import (
    port_number,
    positive_float,
    positive_int,
    queue_names,
)
from django_pgjobs.worker import DEFAULT_ASYNC_CONCURRENCY, DEFAULT_CONCURRENCY, Worker
from django_pgjobs.worker import hints as worker_hints

logger = logging.getLogger("django_pgjobs")


def queue_list(value: str) -> list[str] | None:
    """``a,b`` -> ["a", "b"]; ``*`` -> every queue."""
    if value.strip() == "*":
        return None
    return queue_names(value)


class Command(BaseCommand):
    help = "Run a django-pgjobs worker: claim due jobs and run them on a thread pool."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            type=queue_list,
            default=None,
            help="comma-separated queues to work on (default: every queue, *)",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=DEFAULT_CONCURRENCY,
            help=f"sync jobs run at once, one thread each (default {DEFAULT_CONCURRENCY})",
        )
        parser.add_argument(
            "--async-concurrency",
            type=positive_int,
            default=DEFAULT_ASYNC_CONCURRENCY,
            help="async def jobs run at once on the worker's event loop "
            f"(default {DEFAULT_ASYNC_CONCURRENCY})",
        )
        parser.add_argument(
            "--batch",
            type=positive_int,
            default=None,
            help="most jobs claimed per round trip (default PGJOBS BATCH_SIZE)",
        )
        parser.add_argument(
            "--burst", action="store_true", help="exit once nothing is due and nothing is running"
        )
        parser.add_argument(
            "--max-jobs", type=positive_int, default=None, help="exit after claiming this many jobs"
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            default=None,
            help="seconds between polls when idle (default PGJOBS POLL_INTERVAL)",
        )
        parser.add_argument(
            "--no-listen",
            action="store_true",
            help="do not LISTEN for wake-ups (behind pgbouncer in transaction mode)",
        )
        parser.add_argument(
            "--no-maintenance",
            action="store_true",
            help="do not run the reaper, pruner and cron ticker in this process",
        )
        parser.add_argument("--worker-id", default=None, help="id recorded on claimed jobs")
        parser.add_argument(
            "--health-file",
            default=None,
            metavar="PATH",
            help="touch PATH while this worker heartbeats (for a liveness "
            "probe: python -m django_pgjobs.health PATH)",
        )
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            default=None,
            help="serve Prometheus metrics at /metrics on this port (0: a free "
            "port, printed at start; default PGJOBS METRICS_PORT)",
        )

    def worker_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for ``Worker`` from the parsed options (extend here)."""
        return {
            "queues": options["queues"],
            "concurrency": options["concurrency"],
            "async_concurrency": options["async_concurrency"],
            "batch": options["batch"],
            "burst": options["burst"],
            "max_jobs": options["max_jobs"],
            "poll_interval": options["poll_interval"],
            "listen": False if options["no_listen"] else None,
            "maintenance": not options["no_maintenance"],
            "worker_id": options["worker_id"],
        }

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]
        own_console = console_logging(verbosity)
        alias = get_settings().DATABASE
        problem = readiness.check(alias)
        if problem is not None and (problem.fatal or options["burst"]):
            if not own_console:  # the project's logging (files, aggregators) hears it too
                logger.error("runjobs cannot start: %s", problem.message)
            self.stderr.write(f"runjobs: {problem.message}")
            sys.exit(2)
        if options["queues"]:
            for warning in worker_hints.unknown_queue_warnings(options["queues"], alias):
                logger.warning(warning)
        worker = Worker(**self.worker_options(options))
        metrics = self._start_metrics(options["metrics_port"], options["queues"])
        health = None
        if options["health_file"]:
            health = HealthFile(options["health_file"], worker_id=worker.id, alias=alias)
            health.start()
        try:
            code = worker.run()
        finally:
            if health is not None:
                health.stop()
            if metrics:
                from django_pgjobs.health import metrics as metrics_module

                metrics_module.stop()
        if options["burst"] and worker.claimed_count == 0:
            warn, why = worker_hints.idle_burst_explanation(worker.queues, alias)
            logger.log(
                logging.WARNING if warn else logging.INFO,
                "worker %s did nothing: %s",
                worker.id,
                why,
            )
        if verbosity >= 1 and not summary_was_logged():
            self.stdout.write(f"worker {worker.id} stopped: {worker.counts}")
        if worker.restart_reason:
            # Threads abandoned by timed-out jobs cannot be killed: start afresh in
            # this same process (same pid for the process manager), as a new worker.
            self.stderr.write(f"restarting: {worker.restart_reason}")
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, sys.orig_argv)  # noqa: S606 - this same interpreter and argv
        # Job threads still running after a timed-out shutdown were released; do not
        # let the interpreter wait for them (thread pools join at exit).
        if any(t.name.startswith("pgjobs-job") and t.is_alive() for t in threading.enumerate()):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            sys.exit(code)

    def _start_metrics(self, port: int | None, queues: list[str] | None) -> bool:
        """``--metrics-port`` (or PGJOBS METRICS_PORT): serve /metrics before claiming."""
        if port is None:
            port = get_settings().METRICS_PORT
        if port is None:
            return False
        try:
            from django_pgjobs.health import metrics
        except ImproperlyConfigured as exc:
            raise CommandError(f"--metrics-port: {exc}") from None
        try:
            _, bound = metrics.start(port, queues=queues)
        except OSError as exc:
            raise CommandError(
                f"--metrics-port {port}: cannot listen on it ({exc}); give each "
                "worker process on a host its own port, or 0 for a free one"
            ) from None
        self.stdout.write(f"serving Prometheus metrics at http://0.0.0.0:{bound}/metrics")
        self.stdout.flush()
        return True


def console_logging(verbosity: int) -> bool:
    """Log to stderr when the project has not configured the ``django_pgjobs`` logger
    (or the root logger): ``-v 0`` warnings, ``-v 1`` info (the default), ``-v 2`` debug.
    True when it did."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(level)
        return True
    if verbosity >= 2:
        logger.setLevel(logging.DEBUG)
    return False


def summary_was_logged() -> bool:
    """The worker logs its summary (``worker … stopped: {…}``) at INFO; print it on
    stdout only when that line went nowhere, so a run ends with exactly one."""
    return logger.isEnabledFor(logging.INFO) and logger.hasHandlers()
