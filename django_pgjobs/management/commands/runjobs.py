"""``manage.py runjobs``: parse the options, then run a worker process
(``django_pgjobs/management/worker_process.py``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_pgjobs.management import worker_process
from django_pgjobs.management.selection import (
    listen_address,
    port_number,
    positive_float,
    positive_int,
    queue_names,
    worker_id,
)
from django_pgjobs.worker import DEFAULT_ASYNC_CONCURRENCY, DEFAULT_CONCURRENCY


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
        parser.add_argument(
            "--worker-id", type=worker_id, default=None, help="id recorded on claimed jobs"
        )
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
        parser.add_argument(
            "--metrics-address",
            type=listen_address,
            default=None,
            metavar="ADDRESS",
            help="address /metrics listens on (default PGJOBS METRICS_ADDRESS, "
            "127.0.0.1: this host only; 0.0.0.0 or :: for every interface)",
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
        worker_process.run(
            self.worker_options(options),
            health_file=options["health_file"],
            metrics_port=options["metrics_port"],
            metrics_address=options["metrics_address"],
            verbosity=options["verbosity"],
            stdout=self.stdout,
            stderr=self.stderr,
        )
