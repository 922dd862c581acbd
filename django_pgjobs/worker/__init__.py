"""The worker: claim jobs, run them on threads or an event loop, write their outcomes.

``loop`` puts one worker's parts together: ``claimer`` (the claim loop), ``running``
(the job threads of ``runners`` and the event loop of ``async_runner``), ``completer``
(writes outcomes through ``outcomes``), ``heartbeat``, ``watchdog`` and the
``inflight`` table they share. ``executor`` turns one handler call into an outcome;
``listener`` wakes the claim loop on NOTIFY; ``hints`` tells about queues the worker
was asked for that nothing uses. What ``runjobs`` adds around a worker (signals,
restart, metrics, health file) is ``django_pgjobs/management/worker_process.py``.
"""

from django_pgjobs.worker.loop import DEFAULT_ASYNC_CONCURRENCY, DEFAULT_CONCURRENCY, Worker

__all__ = ["DEFAULT_ASYNC_CONCURRENCY", "DEFAULT_CONCURRENCY", "Worker"]
