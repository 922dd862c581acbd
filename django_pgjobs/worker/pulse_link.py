"""The worker's end of its heartbeat process (``django_pgjobs/pulse.py``): start it,
feed it, and keep one running.

The heartbeat thread cannot beat while a job holds the GIL; the heartbeat process
can, so the worker keeps it told: each job claimed (``added``, called by the
in-flight table before the job can start) and, after each beat of the thread, the
whole set with the moment that beat began (``beaten``). One lock orders the two, so
a set taken before a claim is never written after it. Leases the process found lost
come back on its stdout and are reported like the thread's own (``on_lost``).

Neither write ever waits for the process (``pulse_child.py``): a process that stops
reading must not stop the claimer or the heartbeat thread. A supervisor thread
replaces a process that died, that stopped reading or answering, or whose pipe
filled: the old one is killed, the loss said once, and a new one started after a
backoff and handed the whole set in flight. Until it runs the worker is degraded:
its heartbeat thread alone keeps its jobs alive (``degraded`` says why; the health
file, the worker row and ``jobs_status`` show it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django_pgjobs.worker.pulse_child import PulseChild

logger = logging.getLogger("django_pgjobs")

#: What the worker says when it runs without its heartbeat process.
WITHOUT = (
    "worker %s: no heartbeat process (%s): the heartbeat thread alone keeps its jobs "
    "alive, so a job holding the GIL longer than STALE_AFTER can be taken for dead"
)
#: Seconds before the first restart; doubled after each process that did not last
#: RESTART_RESET seconds, up to RESTART_MAX.
RESTART_FIRST = 0.5
RESTART_MAX = 60.0
RESTART_RESET = 60.0
#: A process whose whole-set lines go unanswered this long (or SILENT_INTERVALS
#: heartbeat intervals, if longer) is replaced.
SILENT_AFTER = 10.0
SILENT_INTERVALS = 3.0

Leases = Callable[[], list[tuple[int, int]]]


class PulseLink:
    """Start, feed, supervise and stop the worker's heartbeat process."""

    #: The module run as the heartbeat process (``python -m``). The fault matrix's
    #: injector (tests/faults/injector.py) sets its own, which wraps this one's
    #: connection and then runs it unchanged.
    module = "django_pgjobs.pulse"

    def __init__(
        self,
        *,
        worker_id: str,
        on_lost: Callable[[int, int], None],
        leases: Leases | None = None,
    ):
        self.worker_id = worker_id
        self.on_lost = on_lost
        self._leases = leases  # the whole set, handed to a new process
        self.ready = threading.Event()  # the current process said "ready"
        self._lock = threading.Lock()
        self._child: PulseChild | None = None
        self._config: dict[str, Any] = {}
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._degraded: str | None = None
        self._failing = False  # a failed start was said (said once per series)
        #: processes started after the first (replacements)
        self.restarts = 0

    @property
    def proc(self) -> Any:
        child = self._child
        return None if child is None else child.proc

    @property
    def alive(self) -> bool:
        child = self._child
        return child is not None and child.failed is None and not self._stopping.is_set()

    @property
    def degraded(self) -> str | None:
        """Why the worker runs without its heartbeat process now (None: it has one)."""
        return self._degraded

    def start(self, config: dict[str, Any]) -> bool:
        """Launch the process with ``config`` (connection, interval, statements, worker
        row) and supervise it; False, said once, where it cannot run at all."""
        if not sys.platform.startswith("linux"):
            logger.warning(WITHOUT, self.worker_id, "it needs Linux")
            return False
        self._config = config
        self._spawn()  # a failure is said, and tried again by the supervisor
        self._supervisor = threading.Thread(
            target=self._supervise, name="pgjobs-pulse-supervisor", daemon=True
        )
        self._supervisor.start()
        return True

    # ------------------------------------------------------------------ to the process

    def added(self, items: Iterable[tuple[int, int]]) -> None:
        """Jobs just claimed, before they can start."""
        text = "".join(f"+ {job} {lease}\n" for job, lease in items)
        with self._lock:
            if self._child is not None:
                self._child.send(text)

    def beaten(self, leases: Leases, started: float) -> None:
        """The thread beat, starting at ``started`` (``time.monotonic()``, one clock
        for every process of the machine): the whole set now in flight."""
        with self._lock:
            if self._child is None:
                return
            pairs = ",".join(f"{j}:{lease}" for j, lease in leases())
            mark = f"@{started:.6f}"
            self._child.send(f"= {mark} {pairs}\n", whole=mark)

    # ------------------------------------------------------------------ from the process

    def _on_line(self, child: PulseChild, words: list[str]) -> None:
        if words == ["ready"]:
            if child is self._child:  # degraded until a replacement proves it runs
                self._degraded = None
                self.ready.set()
        elif len(words) == 3 and words[0] == "lost":
            try:
                self.on_lost(int(words[1]), int(words[2]))
            except Exception:  # reading on matters more: an unread pipe stops its beats
                logger.exception("worker %s: reporting a lost lease failed", self.worker_id)

    # ------------------------------------------------------------------ supervision

    def _spawn(self) -> int | None:
        """Start a process and hand it the config and the whole set in flight; its pid
        (None: it could not start, or the link stops)."""
        try:
            child = PulseChild.spawn(self.module, self._on_line, self._wake)
        except (OSError, ValueError) as exc:
            self._degraded = f"it could not start: {exc}"
            if not self._failing:
                self._failing = True
                logger.warning(WITHOUT, self.worker_id, self._degraded)
            return None
        with self._lock:
            if self._stopping.is_set():  # stop() came meanwhile: nothing may outlive it
                child.kill()
                return None
            # Under the lock: every claim not in this set is sent to this process.
            leases = self._leases() if self._leases is not None else []
            config = {**self._config, "parent": os.getpid(), "leases": leases}
            child.send(json.dumps(config) + "\n", keep=True)
            self.ready.clear()
            self._child = child
        self._failing = False
        return child.pid

    def _supervise(self) -> None:
        interval = float(self._config.get("interval", 1.0))
        tick = min(0.5, interval / 4)
        silent_after = max(SILENT_AFTER, SILENT_INTERVALS * interval)
        delay = RESTART_FIRST
        last = time.monotonic()
        while not self._stopping.is_set():
            self._wake.wait(tick)
            self._wake.clear()
            try:
                delay, last = self._look(delay, last, tick, silent_after)
            except Exception:  # it must go on: the processes it started die with it
                logger.exception("worker %s: supervising the heartbeat process", self.worker_id)

    def _look(
        self, delay: float, last: float, tick: float, silent_after: float
    ) -> tuple[float, float]:
        """One look at the process, replaced if it is in trouble: the next restart
        delay and the time of this look."""
        now = time.monotonic()
        # Time this thread did not run (a job holding the GIL) is not silence.
        gap = min(now - last, 2 * tick)
        child = self._child
        if child is not None:
            child.flush()  # what a full pipe could not take before
            why = child.trouble(gap, silent_after)
            if why is None:
                return delay, now
            if now - child.started >= RESTART_RESET:
                delay = RESTART_FIRST
            self._drop(child, why, delay)
        if self._stopping.wait(delay):
            return delay, now
        pid = self._spawn()
        if pid is not None:
            self.restarts += 1
            logger.warning("worker %s: heartbeat process restarted (pid %d)", self.worker_id, pid)
        return min(delay * 2, RESTART_MAX), time.monotonic()

    def _drop(self, child: PulseChild, why: str, delay: float) -> None:
        with self._lock:
            if self._child is child:
                self._child = None
        self._degraded = f"heartbeat process {child.pid} dropped: {why}"
        child.kill()
        if not self._stopping.is_set():
            logger.warning(
                WITHOUT + "; restarting it in %.1fs", self.worker_id, self._degraded, delay
            )

    # ------------------------------------------------------------------ stop

    def stop(self, timeout: float = 5.0) -> None:
        """Close its stdin (it exits at EOF) and wait: it must not refresh the worker
        row after the worker deletes it. Killed if it does not exit in time."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.close(timeout)
        if self._supervisor is not None:
            self._supervisor.join(timeout=timeout)
