"""One event loop per worker for ``async def`` jobs.

Running each coroutine under ``asyncio.run()`` on a job thread limits I/O-bound
async work to the number of threads; here hundreds of coroutines share one
loop in one thread, limited by ``--async-concurrency``. The worker cancels a
coroutine (``Task.cancel``) when its run times out or at shutdown. Django's
async ORM works inside: it runs its queries in Django's own sync threads.

The loop is shared, so it must survive what any one job does to it
(docs/explanation/guarantees.md, "Hostile values and hostile jobs"):
``loop.stop()`` or ``loop.close()`` from a job raises in that job alone (only the
runner stops its loop); ``SystemExit`` or ``KeyboardInterrupt`` escaping a task the
job spawned is logged and the loop runs on; a job that blocks the loop for
seconds is named in a warning by a watchdog thread while it blocks. A job may cancel
its neighbours' tasks (``asyncio.all_tasks()``): every task is told apart by who
cancelled it (``loop_cancels``), and every job's task, however it ends (even
cancelled before it ever ran, or while it waited for a slot), is reported to
``ended``, so no claimed job is left without an outcome.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from django_pgjobs.worker.loop_cancels import CancelLedger, by_the_worker, enter_job

logger = logging.getLogger("django_pgjobs")

#: Seconds the loop may go without running its callbacks before the watchdog warns.
BLOCKED_WARN_AFTER = 2.0


class _WorkerLoop(asyncio.SelectorEventLoop):
    """The runner's loop: only the runner itself may stop or close it."""

    _pgjobs_owner_stopping = False

    def stop(self) -> None:
        if not self._pgjobs_owner_stopping:
            raise RuntimeError(
                "a job may not stop the worker's event loop: it runs the other async jobs"
            )
        super().stop()

    def close(self) -> None:
        if not self._pgjobs_owner_stopping:
            raise RuntimeError(
                "a job may not close the worker's event loop: it runs the other async jobs"
            )
        super().close()


class AsyncRunner:
    """``submit(key, item)`` runs ``target(item)`` as a task on the runner's loop, then
    calls ``ended(item)`` once its task is over, whether ``target`` ran or not."""

    def __init__(
        self,
        target: Callable[[Any], Awaitable[None]],
        limit: int,
        name: str = "pgjobs-async",
        *,
        ended: Callable[[Any], None] | None = None,
    ):
        self._target = target
        self._ended = ended
        self.cancels = CancelLedger()
        # At most ``limit`` run at once; the others wait their turn (not yet started:
        # their timeout has not begun).
        self._slots = asyncio.Semaphore(limit)
        self.loop = _WorkerLoop()
        self.loop.set_task_factory(self.cancels.task_factory)
        self._tasks: dict[Hashable, asyncio.Task[None]] = {}
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._last_tick = time.monotonic()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._ready.wait(10)
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)
        self._watchdog.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            while not self._stopping.is_set():
                try:
                    self.loop.run_forever()
                except BaseException as exc:
                    # SystemExit / KeyboardInterrupt out of a task a job spawned: asyncio
                    # re-raises them out of run_forever. Run on; the task is done.
                    logger.error(
                        "async job runner: %s escaped a task on the event loop; ignored, "
                        "the loop runs on",
                        type(exc).__name__,
                        exc_info=exc,
                    )
        finally:
            self._close()

    def _close(self) -> None:
        # run_until_complete stops the loop itself when its future is done.
        self.loop._pgjobs_owner_stopping = True
        try:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            with by_the_worker():
                for task in pending:
                    task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        except BaseException:
            logger.exception("async job runner: error while closing the event loop")
        finally:
            self.loop.close()

    def _tick(self) -> None:
        self._last_tick = time.monotonic()

    def _watch(self) -> None:
        """Warn, naming the running task (its job id), while the loop is blocked."""
        interval = BLOCKED_WARN_AFTER / 4
        warned_for: object = None
        while not self._stopping.wait(interval):
            try:
                self.loop.call_soon_threadsafe(self._tick)
            except RuntimeError:  # closed
                return
            blocked = time.monotonic() - self._last_tick
            if blocked < BLOCKED_WARN_AFTER:
                warned_for = None
                continue
            task = asyncio.current_task(self.loop)
            if task is None or task is warned_for:
                continue
            warned_for = task
            frame = sys._current_frames().get(self.thread.ident or 0)
            where = (
                f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
                if frame is not None
                else "?"
            )
            logger.warning(
                "async job runner: %s has blocked the event loop for %.1fs (at %s); "
                "every other async job of this worker waits meanwhile",
                task.get_name(),
                blocked,
                where,
            )

    def submit(self, key: Hashable, item: Any) -> None:
        self.loop.call_soon_threadsafe(self._spawn, key, item)

    def _spawn(self, key: Hashable, item: Any) -> None:
        self.cancels.begin(key)
        task = self.loop.create_task(self._guarded(key, item), name=f"job {key}")
        self.cancels.track(task, key)
        self._tasks[key] = task
        # A task cancelled before its first step never runs its coroutine (no finally,
        # no outcome): only a done callback hears of it.
        task.add_done_callback(lambda _: self._over(key, task, item))

    async def _guarded(self, key: Hashable, item: Any) -> None:
        enter_job(key)
        try:
            async with self._slots:
                await self._target(item)
        except asyncio.CancelledError:
            pass  # the target has reported what it could; ``ended`` sees to the rest
        except BaseException:  # the loop must outlive any job
            logger.exception("async job runner: unexpected error (job key %s)", key)

    def _over(self, key: Hashable, task: asyncio.Task[None], item: Any) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if self._ended is not None:
            try:
                self._ended(item)
            except BaseException:  # the loop must outlive any job
                logger.exception("async job runner: error after job key %s ended", key)

    def cancel(self, key: Hashable) -> None:
        """Cancel the task of ``key`` (timeout, shutdown); a no-op once it finished."""

        def cancel() -> None:
            task = self._tasks.get(key)
            if task is not None:
                with by_the_worker():
                    task.cancel()

        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(cancel)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._owner_stop)
            except RuntimeError:
                return
        self.thread.join(timeout)

    def _owner_stop(self) -> None:
        self.loop._pgjobs_owner_stopping = True
        try:
            self.loop.stop()
        finally:
            self.loop._pgjobs_owner_stopping = False
