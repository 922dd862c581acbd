"""One event loop per worker for ``async def`` jobs.

Running each coroutine under ``asyncio.run()`` on a job thread limits I/O-bound
async work to the number of threads; here hundreds of coroutines share one
loop in one thread, limited by ``--async-concurrency``. The worker cancels a
coroutine (``Task.cancel``) when its run times out or at shutdown. Django's
async ORM works inside: it runs its queries in Django's own sync threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

logger = logging.getLogger("django_pgjobs")


class AsyncRunner:
    """``submit(key, item)`` runs ``target(item)`` as a task on the runner's loop."""

    def __init__(
        self, target: Callable[[Any], Awaitable[None]], limit: int, name: str = "pgjobs-async"
    ):
        self._target = target
        # At most ``limit`` run at once; the others wait their turn (not yet started:
        # their timeout has not begun).
        self._slots = asyncio.Semaphore(limit)
        self.loop = asyncio.new_event_loop()
        self._tasks: dict[Hashable, asyncio.Task[None]] = {}
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._ready.wait(10)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def submit(self, key: Hashable, item: Any) -> None:
        self.loop.call_soon_threadsafe(self._spawn, key, item)

    def _spawn(self, key: Hashable, item: Any) -> None:
        task = self.loop.create_task(self._guarded(key, item))
        self._tasks[key] = task

    async def _guarded(self, key: Hashable, item: Any) -> None:
        try:
            async with self._slots:
                await self._target(item)
        except asyncio.CancelledError:
            pass
        except BaseException:  # the loop must outlive any job
            logger.exception("async job runner: unexpected error (job key %s)", key)
        finally:
            self._tasks.pop(key, None)

    def cancel(self, key: Hashable) -> None:
        """Cancel the task of ``key`` (timeout, shutdown); a no-op once it finished."""

        def cancel() -> None:
            task = self._tasks.get(key)
            if task is not None:
                task.cancel()

        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(cancel)

    def stop(self, timeout: float = 5.0) -> None:
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:
                return
        self.thread.join(timeout)
