"""The worker: claim jobs, run them on threads or an event loop, write their outcomes.

``loop`` is the process's main loop and owns the threads; ``runners`` and
``async_runner`` run handlers; ``executor`` turns one handler call into an outcome;
``outcomes`` is the one place outcomes are written; ``listener`` wakes the loop on
NOTIFY; ``skew`` and ``hints`` deal with tasks and queues the worker does not know.
"""

from django_pgjobs.worker.loop import DEFAULT_ASYNC_CONCURRENCY, DEFAULT_CONCURRENCY, Worker

__all__ = ["DEFAULT_ASYNC_CONCURRENCY", "DEFAULT_CONCURRENCY", "Worker"]
