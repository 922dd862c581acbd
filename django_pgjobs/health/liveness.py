"""Whether a live worker still runs jobs: the health file's second condition.

A heartbeat proves the process and its connection live, not that it works: a worker
whose every job slot runs a job that never returns claims nothing while jobs wait,
and its heartbeat stays fresh. ``stuck_slots`` makes the health file go stale then
(``runjobs --health-file``), so the supervisor restarts it; the reaper and the
lease fencing take care of the jobs it held.

A run counts as stuck once it has run longer than ``HEALTH_STUCK_AFTER`` and longer
than its own ``timeout`` (a job allowed an hour is not stuck at ten minutes; past
its timeout the watchdog gives up on it and its slot is free again anyway).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django_pgjobs.worker.inflight import RUNNING
from django_pgjobs.worker.loop import Worker


def stuck_slots(worker: Worker, bound: float) -> Callable[[], str | None]:
    """A check for ``HealthFile(stuck=...)``: None while some slot is free or runs a
    job younger than its bound; else why the worker is not alive."""

    def check() -> str | None:
        now = time.monotonic()
        stuck: dict[bool, list[int]] = {False: [], True: []}  # is_async -> job ids
        for entry in worker.inflight.unsettled():
            if entry.state != RUNNING:
                continue
            if now - entry.started > max(bound, entry.timeout or 0.0):
                stuck[entry.is_async].append(entry.claimed.id)
        threads, loop = stuck[False], stuck[True]
        if len(threads) >= worker.concurrency:
            kind, ids = f"all {worker.concurrency} job threads", threads
        elif len(loop) >= worker.async_concurrency:
            kind, ids = f"all {worker.async_concurrency} event-loop slots", loop
        else:
            return None
        shown = ", ".join(str(i) for i in sorted(ids)[:10])
        return (
            f"{kind} have run the same jobs for over {bound:g}s "
            f"(PGJOBS['HEALTH_STUCK_AFTER']): job ids {shown}"
        )

    return check
