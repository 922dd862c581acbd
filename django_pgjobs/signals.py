"""Signals sent by the worker. Receivers are isolated: one that raises is logged
and cannot change a job's outcome or stop the worker.

=================  ===========================================================
signal             keyword arguments
=================  ===========================================================
jobs_claimed       jobs (list of (id, task, queue)), worker  (after each claim)
job_started        job_id, task, queue, attempt, lease, worker
job_succeeded      job_id, task, queue, attempt, lease, worker, result
job_failed         job_id, task, queue, attempt, lease, worker, exception, retry_in
job_dead           job_id, task, queue, attempt, lease, worker, exception
job_timed_out      job_id, task, queue, attempt, lease, worker, retry_in
                   (``retry_in`` None when the job was dead-lettered)
job_released       job_id, task, queue, attempt, lease, worker  (given back at
                   shutdown, or after another job cancelled its async task; attempt
                   not counted)
job_parked         job_id, task, queue, attempt, lease, worker, until, waiting_for
                   (a durable run ended in a sleep or a wait; attempt not counted)
job_fenced         job_id, task, queue, lease, worker, write  (a zombie's refused write)
jobs_reaped        jobs (list of (id, task, new status)), worker
=================  ===========================================================

The Prometheus metrics (``django_pgjobs.health.metrics``) are fed by these signals, so
a receiver of your own sees exactly what the metrics count.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_pgjobs")

job_started = Signal()
job_succeeded = Signal()
job_failed = Signal()
job_dead = Signal()
job_fenced = Signal()
jobs_reaped = Signal()
jobs_claimed = Signal()
job_released = Signal()
job_timed_out = Signal()
job_parked = Signal()


def send(signal: Signal, sender: Any = None, **kwargs: Any) -> None:
    """``send_robust`` that logs what a receiver raised, never propagates it.

    The one way the package sends a signal, its own and ``django.tasks``' alike
    (``tasks.bridge`` sends ``task_started`` / ``task_finished`` through it)."""
    if not signal.receivers:
        return
    for receiver, response in signal.send_robust(sender=sender, **kwargs):
        if isinstance(response, BaseException):
            logger.error(
                "signal receiver %r raised %r (ignored; the job's outcome is unchanged)",
                receiver,
                response,
                exc_info=response,
            )
