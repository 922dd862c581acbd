"""The worker's end of its heartbeat process (``django_pgjobs/pulse.py``).

The heartbeat thread cannot beat while a job holds the GIL; the heartbeat process
can, so the worker keeps it told: each job claimed (``added``, called by the
in-flight table before the job can start) and, after each beat of the thread, the
whole set with the moment that beat began (``beaten``). One lock orders the two, so
a set taken before a claim is never written after it. Leases the process found lost come back on its
stdout and are reported like the thread's own (``on_lost``).

Writing to a pipe needs the GIL too; that is fine: the process keeps beating the
last set it knows, which is exactly what a job holding the GIL needs. When the
process cannot start or dies, the thread alone keeps the jobs alive, as before,
and the worker says so once.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from typing import IO, Any

logger = logging.getLogger("django_pgjobs")

#: What the worker says when it runs without its heartbeat process.
WITHOUT = (
    "worker %s: no heartbeat process (%s): the heartbeat thread alone keeps its jobs "
    "alive, so a job holding the GIL longer than STALE_AFTER can be taken for dead"
)


class PulseLink:
    """Start, feed and stop one heartbeat process."""

    #: The module run as the heartbeat process (``python -m``). The fault matrix's
    #: injector (tests/faults/injector.py) sets its own, which wraps this one's
    #: connection and then runs it unchanged.
    module = "django_pgjobs.pulse"

    def __init__(self, *, worker_id: str, on_lost: Callable[[int, int], None]):
        self.worker_id = worker_id
        self.on_lost = on_lost
        self.proc: subprocess.Popen[str] | None = None
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._broken = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self._broken

    def start(self, config: dict[str, Any]) -> bool:
        """Launch the process and hand it ``config`` (connection, interval, statements,
        worker row); False, said once, if it cannot start."""
        if not sys.platform.startswith("linux"):
            logger.warning(WITHOUT, self.worker_id, "it needs Linux")
            return False
        env = dict(os.environ)
        # the worker's own import path, so the process finds psycopg and this package
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            text = json.dumps({**config, "parent": os.getpid()})
            self.proc = subprocess.Popen(  # noqa: S603 - our interpreter, a module name of ours
                [sys.executable, "-m", self.module],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
                bufsize=1,
            )
            self._write(text + "\n")
        except (OSError, TypeError, ValueError) as exc:
            self._give_up(f"it could not start: {exc}")
            if self.proc is not None:
                self.proc.kill()
                self.proc.wait()
            return False
        if self.proc.stdout is not None:
            self._reader = threading.Thread(
                target=self._read, args=(self.proc.stdout,), name="pgjobs-pulse", daemon=True
            )
            self._reader.start()
        return True

    # ------------------------------------------------------------------ to the process

    def added(self, items: Iterable[tuple[int, int]]) -> None:
        """Jobs just claimed, before they can start."""
        self._write("".join(f"+ {job} {lease}\n" for job, lease in items))

    def beaten(self, leases: Callable[[], list[tuple[int, int]]], started: float) -> None:
        """The thread beat, starting at ``started`` (``time.monotonic()``, one clock
        for every process of the machine): the whole set now in flight."""
        with self._lock:
            items = leases()
            pairs = ",".join(f"{j}:{lease}" for j, lease in items)
            self._write_locked(f"= @{started:.6f} {pairs}\n")

    def _write(self, text: str) -> None:
        with self._lock:
            self._write_locked(text)

    def _write_locked(self, text: str) -> None:
        if self._broken or self.proc is None or self.proc.stdin is None or not text:
            return
        try:
            self.proc.stdin.write(text)
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:
            self._give_up(f"it stopped: {exc}")

    # ------------------------------------------------------------------ from the process

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            words = line.split()
            if words == ["ready"]:
                self.ready.set()
            elif len(words) == 3 and words[0] == "lost":
                try:
                    self.on_lost(int(words[1]), int(words[2]))
                except Exception:  # reading on matters more: an unread pipe stops its beats
                    logger.exception("worker %s: reporting a lost lease failed", self.worker_id)
        proc = self.proc
        if not self._broken and proc is not None:  # not stop(): it died
            self._give_up(f"it exited with status {proc.wait()}")

    def _give_up(self, why: str) -> None:
        if not self._broken:
            self._broken = True
            logger.warning(WITHOUT, self.worker_id, why)

    # ------------------------------------------------------------------ stop

    def stop(self, timeout: float = 5.0) -> None:
        """Close its stdin (it exits at EOF) and wait: it must not refresh the worker
        row after the worker deletes it. Killed if it does not exit in time."""
        with self._lock:
            proc, self.proc = self.proc, None
            self._broken = True
            if proc is None:
                return
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=timeout)
        if proc.stdout is not None:
            proc.stdout.close()
