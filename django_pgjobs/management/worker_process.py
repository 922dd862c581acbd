"""What a ``runjobs`` process adds around a Worker: it refuses to start against a
database that is not ready, logs to the console when the project does not, stops
gracefully on SIGTERM/SIGINT, serves metrics and touches the health file while the
worker runs, and when the worker asks to be restarted (threads abandoned by
timed-out jobs cannot be killed) starts afresh in the same process.

``manage.py runjobs`` parses its options and calls ``run``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any, NoReturn

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, OutputWrapper

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness
from django_pgjobs.health.health_file import HealthFile, check_writable
from django_pgjobs.health.liveness import stuck_slots
from django_pgjobs.worker import hints
from django_pgjobs.worker.loop import Worker

logger = logging.getLogger("django_pgjobs")


def run(
    worker_options: dict[str, Any],
    *,
    health_file: str | None,
    metrics_port: int | None,
    verbosity: int,
    metrics_address: str | None = None,
    stdout: OutputWrapper,
    stderr: OutputWrapper,
) -> None:
    """Run one Worker as this process until it stops, then exit with its code
    (``sys.exit``; 2 when the database is not ready), or restart the process."""
    own_console = console_logging(verbosity)
    conf = get_settings()
    alias = conf.DATABASE
    if health_file:
        try:
            check_writable(health_file)
        except OSError as exc:
            stderr.write(
                f"runjobs: --health-file {health_file}: cannot write it ({exc.strerror or exc})"
            )
            sys.exit(2)
    problem = readiness.check(alias)
    if problem is not None and (problem.fatal or worker_options.get("burst")):
        if not own_console:  # the project's logging (files, aggregators) hears it too
            logger.error("runjobs cannot start: %s", problem.message)
        stderr.write(f"runjobs: {problem.message}")
        sys.exit(2)
    if worker_options.get("queues"):
        for warning in hints.unknown_queue_warnings(worker_options["queues"], alias):
            logger.warning(warning)
    worker = Worker(**worker_options)
    metrics = start_metrics(metrics_port, metrics_address, worker.queues, stdout)
    health = None
    if health_file:
        bound = conf.HEALTH_STUCK_AFTER
        stuck = None if bound is None else stuck_slots(worker, bound)
        health = HealthFile(
            health_file, worker_id=worker.id, alias=alias, stuck=stuck, degraded=worker.row.degraded
        )
        health.start()
        # kept fresh by the heartbeat process while a job holds the GIL, up to the bound
        worker.heartbeat.health_file, worker.heartbeat.health_bound = health_file, bound
    try:
        stop_on_signals(worker)
        code = worker.run()
    finally:
        if health is not None:
            health.stop()
        if metrics:
            from django_pgjobs.health import metrics as metrics_module

            metrics_module.stop()
    if worker_options.get("burst") and worker.claimed_count == 0:
        warn, why = hints.idle_burst_explanation(worker.queues, alias)
        logger.log(
            logging.WARNING if warn else logging.INFO, "worker %s did nothing: %s", worker.id, why
        )
    if verbosity >= 1 and not summary_was_logged():
        stdout.write(f"worker {worker.id} stopped: {worker.counts}")
    if worker.restart_reason:
        restart(worker.restart_reason, stderr)
    # Job threads still running after a timed-out shutdown were released; do not
    # let the interpreter wait for them (thread pools join at exit).
    if any(t.name.startswith("pgjobs-job") and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)


def stop_on_signals(worker: Worker) -> None:
    """SIGTERM/SIGINT: the first stops claiming and gives in-flight jobs
    SHUTDOWN_TIMEOUT to finish; a second exits at once (the reaper reclaims the
    rest). Only the main thread can install signal handlers: elsewhere, none."""
    if threading.current_thread() is not threading.main_thread():
        return
    seen = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == 1:
            logger.warning(
                "worker %s got %s: finishing %d in-flight jobs (up to %gs), claiming no more; "
                "send it again to exit at once",
                worker.id,
                signal.Signals(signum).name,
                len(worker.inflight),
                worker.shutdown_timeout,
            )
            worker.request_stop()
        else:
            logger.warning(
                "worker %s: second signal, exiting at once; the reaper will "
                "reclaim %d in-flight jobs",
                worker.id,
                len(worker.inflight),
            )
            os._exit(1)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def restart(reason: str, stderr: OutputWrapper) -> NoReturn:
    """Threads abandoned by timed-out jobs cannot be killed: start afresh in this
    same process (same pid for the process manager), as a new worker."""
    stderr.write(f"restarting: {reason}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)  # noqa: S606 - this same interpreter and argv


def start_metrics(
    port: int | None, address: str | None, queues: list[str] | None, stdout: OutputWrapper
) -> bool:
    """``--metrics-port`` (or PGJOBS METRICS_PORT) on ``--metrics-address`` (or
    METRICS_ADDRESS): serve /metrics before claiming."""
    conf = get_settings()
    if port is None:
        port = conf.METRICS_PORT
    if port is None:
        return False
    address = address or conf.METRICS_ADDRESS
    try:
        from django_pgjobs.health import metrics
    except ImproperlyConfigured as exc:
        raise CommandError(f"--metrics-port: {exc}") from None
    try:
        _, bound = metrics.start(port, address=address, queues=queues)
    except OSError as exc:
        raise CommandError(
            f"--metrics-port {port}: cannot listen on it at {address} ({exc}); give each "
            "worker process on a host its own port, or 0 for a free one, and "
            "--metrics-address an address of this host"
        ) from None
    host = f"[{address}]" if ":" in address else address
    stdout.write(f"serving Prometheus metrics at http://{host}:{bound}/metrics")
    stdout.flush()
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
