"""The job threads: ``concurrency`` long-lived threads fed from one queue.

Used instead of ``ThreadPoolExecutor`` on the worker's hot path: a py-spy
profile of a 40,000-job no-op drain spent ~19% of the claim loop in
``ThreadPoolExecutor.submit`` (a Future, a work item and an idle-semaphore
check per job). Here a hand-off is one ``SimpleQueue.put`` (a C call); the
worker tracks outcomes itself, so nothing needs a Future.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class JobRunners(Generic[T]):
    """``submit(item)`` runs ``target(item)`` on one of ``n`` threads, in FIFO order."""

    def __init__(self, n: int, target: Callable[[T], None], name_prefix: str):
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._target = target
        # Daemon threads: a job still running after a timed-out shutdown was already
        # released, and must not keep the process alive (runjobs exits at once then).
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name_prefix}_{i}", daemon=True)
            for i in range(n)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, item: T) -> None:
        self._queue.put(item)

    def _loop(self) -> None:
        get, target = self._queue.get, self._target
        while (item := get()) is not None:
            target(item)

    def shutdown(self, *, wait: bool = True, cancel_pending: bool = False) -> None:
        """Stop the threads after the queued items (or drop those not started yet)."""
        if cancel_pending:
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
