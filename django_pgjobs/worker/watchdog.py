"""The watchdog: gives up on runs past their timeout, and restarts a worker whose
abandoned threads pile up (docs/reference/api.md, timeouts).

Every ``WATCHDOG_INTERVAL`` it looks for runs past their deadline. Each one: its
context turns cancelled, an ``async def`` run's task is cancelled, a ``def`` run's
thread is abandoned (Python cannot stop a thread; a replacement takes its place),
and a ``JobTimeout`` failure goes to the completer, whose write bumps the lease so
anything the abandoned run writes later is fenced. Abandoned threads still running
past ``max_abandoned`` make it stop the worker with a ``restart_reason``, which
``runjobs`` acts on by starting afresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django_pgjobs.worker import executor, outcomes
from django_pgjobs.worker.inflight import InFlight, InFlightTable
from django_pgjobs.worker.outcomes import Outcome
from django_pgjobs.worker.running import JobRuns

logger = logging.getLogger("django_pgjobs")

#: How often the watchdog looks for runs past their timeout (seconds).
WATCHDOG_INTERVAL = 0.1


@dataclass(kw_only=True, eq=False)
class Watchdog:
    """``run(stop)`` checks every WATCHDOG_INTERVAL until ``stop`` is set."""

    table: InFlightTable
    runs: JobRuns
    #: where the timeout failures go (the completer)
    hand_over: Callable[[InFlight, Outcome], None]
    #: slots were freed (the claim loop)
    wake: Callable[[], None]
    #: stop the worker gracefully, to be restarted
    stop_worker: Callable[[], None]
    max_abandoned: int
    worker_id: str
    #: why the watchdog stopped the worker to have it restarted (None: it did not)
    restart_reason: str | None = field(default=None, init=False)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(WATCHDOG_INTERVAL):
            try:
                self.check(time.monotonic())
            except BaseException:  # the watchdog must not die
                logger.exception("timeout watchdog error")

    def check(self, now: float) -> None:
        self.expire(now)
        if self.restart_reason is None:
            self.restart_if_abandoned_pile_up()

    def expire(self, now: float) -> None:
        """Give up on every run past its deadline; its timeout failure is written."""
        expired = self.table.expire(now)
        for entry in expired:
            claimed = entry.claimed
            entry.context.cancel()
            self.runs.give_up(entry)
            if entry.timeout is None:
                raise RuntimeError("a job without a timeout passed its deadline")
            logger.warning(
                "job %s (%s, attempt %s/%s) exceeded its timeout of %gs; giving up on it%s",
                claimed.id,
                claimed.task,
                claimed.attempt,
                claimed.max_attempts,
                entry.timeout,
                "" if entry.is_async else " (its thread is abandoned; a new one takes its place)",
                extra=outcomes.log_extra(claimed, self.worker_id),
            )
            self.hand_over(entry, executor.timed_out(claimed, entry.timeout, self.worker_id))
        if expired:
            self.wake()

    def restart_if_abandoned_pile_up(self) -> None:
        abandoned = self.runs.abandoned_alive
        if abandoned > self.max_abandoned:
            self.restart_reason = (
                f"{abandoned} threads abandoned by timed-out jobs are still running "
                f"(more than {self.max_abandoned}); restarting to get rid of them"
            )
            logger.error("worker %s: %s", self.worker_id, self.restart_reason)
            self.stop_worker()
