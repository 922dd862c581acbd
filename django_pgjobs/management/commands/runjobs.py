"""``manage.py runjobs``: parse options, build a Worker, run it. Behaviour lives in worker.py."""

from __future__ import annotations

import logging
import os
import sys
import threading
from argparse import ArgumentTypeError
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgjobs.conf import get_settings
from django_pgjobs.validation import check_queue
from django_pgjobs.worker import Worker


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise ArgumentTypeError(f"must be a positive number of seconds, got {value!r}")
    return number


def port_number(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise ArgumentTypeError(f"must be a port number (0-65535; 0 picks a free one), got {number}")
    return number


def queue_list(value: str) -> list[str] | None:
    """``a,b`` -> ["a", "b"]; ``*`` -> every queue."""
    if value.strip() == "*":
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise ArgumentTypeError("expected a comma-separated list of queue names, or *")
    for name in names:
        try:
            check_queue(name)
        except ValueError as exc:
            raise ArgumentTypeError(str(exc)) from None
    return names


class Command(BaseCommand):
    help = "Run a django-pgjobs worker: claim due jobs and run them on a thread pool."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", type=queue_list, default=None,
                            help="comma-separated queues to work on (default: every queue, *)")
        parser.add_argument("--concurrency", type=positive_int, default=8,
                            help="jobs run at once, one thread each (default 8)")
        parser.add_argument("--batch", type=positive_int, default=None,
                            help="most jobs claimed per round trip (default PGJOBS BATCH_SIZE)")
        parser.add_argument("--burst", action="store_true",
                            help="exit once nothing is due and nothing is running")
        parser.add_argument("--max-jobs", type=positive_int, default=None,
                            help="exit after claiming this many jobs")
        parser.add_argument("--poll-interval", type=positive_float, default=None,
                            help="seconds between polls when idle (default PGJOBS POLL_INTERVAL)")
        parser.add_argument("--no-listen", action="store_true",
                            help="do not LISTEN for wake-ups (behind pgbouncer in transaction mode)")
        parser.add_argument("--no-maintenance", action="store_true",
                            help="do not run the reaper, pruner and cron ticker in this process")
        parser.add_argument("--worker-id", default=None, help="id recorded on claimed jobs")
        parser.add_argument("--metrics-port", type=port_number, default=None,
                            help="serve Prometheus metrics at /metrics on this port (0: a free "
                                 "port, printed at start; default PGJOBS METRICS_PORT)")

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]
        if verbosity >= 2:
            logging.getLogger("django_pgjobs").setLevel(logging.DEBUG)
        worker = Worker(
            queues=options["queues"],
            concurrency=options["concurrency"],
            batch=options["batch"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            poll_interval=options["poll_interval"],
            listen=False if options["no_listen"] else None,
            maintenance=not options["no_maintenance"],
            worker_id=options["worker_id"],
        )
        metrics = self._start_metrics(options["metrics_port"], options["queues"])
        try:
            code = worker.run()
        finally:
            if metrics:
                from django_pgjobs import metrics as metrics_module

                metrics_module.stop()
        if verbosity >= 1:
            self.stdout.write(f"worker {worker.id} done: {worker.counts}")
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
            from django_pgjobs import metrics
        except ImproperlyConfigured as exc:
            raise CommandError(f"--metrics-port: {exc}") from None
        try:
            _, bound = metrics.start(port, queues=queues)
        except OSError as exc:
            raise CommandError(f"--metrics-port {port}: cannot listen on it ({exc}); give each "
                               "worker process on a host its own port, or 0 for a free one"
                               ) from None
        self.stdout.write(f"serving Prometheus metrics at http://0.0.0.0:{bound}/metrics")
        self.stdout.flush()
        return True
