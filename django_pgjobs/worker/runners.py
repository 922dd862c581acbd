"""The job threads: ``concurrency`` long-lived threads fed from one queue.

Used instead of ``ThreadPoolExecutor`` on the worker's hot path: in a profile of a
no-op drain ``ThreadPoolExecutor.submit`` (a Future, a work item and an
idle-semaphore check per job) was a large share of the claim loop. Here a hand-off is
one ``SimpleQueue.put`` (a C call); the
worker tracks outcomes itself, so nothing needs a Future.

A thread whose job timed out is *abandoned* (Python cannot kill a thread): a
replacement thread takes its place at once, and the abandoned one exits when
its job finally returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class JobRunners(Generic[T]):
    """``submit(item)`` runs ``target(item)`` on one of ``n`` threads, in FIFO order;
    each thread first calls ``initializer`` (as ``ThreadPoolExecutor``'s)."""

    def __init__(
        self,
        n: int,
        target: Callable[[T], None],
        name_prefix: str,
        initializer: Callable[[], None] | None = None,
    ):
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._target = target
        self._initializer = initializer
        self._prefix = name_prefix
        self._lock = threading.Lock()
        self._abandoned: set[threading.Thread] = set()
        self._made = 0
        # Daemon threads: a job still running after a timed-out shutdown was already
        # released, and must not keep the process alive (runjobs exits at once then).
        self._threads = [self._new_thread() for _ in range(n)]
        for thread in self._threads:
            thread.start()

    def _new_thread(self) -> threading.Thread:
        self._made += 1
        return threading.Thread(
            target=self._loop, name=f"{self._prefix}_{self._made - 1}", daemon=True
        )

    def submit(self, item: T) -> None:
        self._queue.put(item)

    def take_queued(self) -> list[T]:
        """Remove and return the items not started yet (prefetched jobs at shutdown)."""
        items: list[T] = []
        try:
            while True:
                item = self._queue.get_nowait()
                if item is None:  # a stop marker: put it back at the end
                    self._queue.put(None)
                    break
                items.append(item)
        except queue.Empty:
            pass
        return items

    def abandon(self, thread: threading.Thread) -> None:
        """``thread`` runs a job the worker gave up on: start a replacement now; the
        abandoned thread exits after its job returns."""
        with self._lock:
            if thread in self._abandoned or thread not in self._threads:
                return
            self._abandoned.add(thread)
            self._threads.remove(thread)
            replacement = self._new_thread()
            replacement.start()
            self._threads.append(replacement)

    @property
    def abandoned_alive(self) -> int:
        with self._lock:
            self._abandoned = {t for t in self._abandoned if t.is_alive()}
            return len(self._abandoned)

    def _loop(self) -> None:
        if self._initializer is not None:
            self._initializer()
        get, target = self._queue.get, self._target
        me = threading.current_thread()
        while (item := get()) is not None:
            target(item)
            if me in self._abandoned:
                return

    def shutdown(self, *, wait: bool = True, cancel_pending: bool = False) -> None:
        """Stop the threads after the queued items (or drop those not started yet)."""
        if cancel_pending:
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()
