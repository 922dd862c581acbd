"""One heartbeat process as its worker sees it: started, written to without ever
blocking, read from, judged and ended (``pulse_link.py`` supervises the series).

The claimer and the heartbeat thread write to it, so a write must never wait for
the process: a process that stops reading (SIGSTOP, a wedged interpreter) would
otherwise fill its pipe and hang both, and the worker's jobs would be reaped from a
live worker. So the pipe is non-blocking, and what it cannot take now waits in a
backlog written out at the next write or supervisor tick. A ``=`` line (the whole
set) supersedes every line queued before it, so the backlog holds about one set
however far the process lags; past ``BACKLOG_BYTES`` the process is given up on.

A process that reads answers each ``=`` line (``ok @started``). One whose ``=``
lines go unanswered is silent; the supervisor counts that silence in its own ticks,
so time when the worker itself could not run (a job holding the GIL starves the
reader of answers as much as anyone) never counts against the process.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

#: Unwritten bytes past which a process is taken for one that does not read: many
#: times a whole set of any worker's jobs (a ``=`` line supersedes what waits).
BACKLOG_BYTES = 1 << 20

#: What the reader hands on: the process and one line's words.
OnLine = Callable[["PulseChild", list[str]], None]


@dataclass
class Pending:
    """Bytes not written yet; a ``=`` line drops the droppable ones before it (not
    the config, nor a line partly written)."""

    data: bytes
    droppable: bool


class PulseChild:
    """One running heartbeat process, its pipes and its standing."""

    def __init__(
        self, proc: subprocess.Popen[bytes], on_line: OnLine, wake: threading.Event
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.started = time.monotonic()
        self._wake = wake  # the supervisor's: a write that failed, an EOF
        if proc.stdin is None or proc.stdout is None:
            raise ValueError("the heartbeat process needs pipes for stdin and stdout")
        self._fd = proc.stdin.fileno()
        os.set_blocking(self._fd, False)
        self._backlog: deque[Pending] = deque()
        self._size = 0
        self._lock = threading.Lock()  # the writers' state against the reader's
        self.failed: str | None = None  # why it must go, once known
        self._asked: str | None = None  # the latest "=" not answered yet
        self.silent = 0.0  # supervisor seconds its latest "=" went unanswered
        self.ended = threading.Event()
        self._reader = threading.Thread(
            target=self._read,
            args=(proc.stdout, on_line),
            name=f"pgjobs-pulse-{proc.pid}",
            daemon=True,
        )
        self._reader.start()

    @classmethod
    def spawn(cls, module: str, on_line: OnLine, wake: threading.Event) -> PulseChild:
        env = dict(os.environ)
        # the worker's own import path, so the process finds psycopg and this package
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        proc = subprocess.Popen(  # noqa: S603 - our interpreter, a module name of ours
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        return cls(proc, on_line, wake)

    # ------------------------------------------------------------------ writing

    def send(self, text: str, *, whole: str | None = None, keep: bool = False) -> None:
        """Queue ``text`` and write what the pipe takes now; never waits. ``whole``:
        the ``@started`` of a whole-set line, which supersedes the droppable lines
        queued before it. ``keep``: never dropped (the config)."""
        with self._lock:
            if self.failed is not None or not text:
                return
            if whole is not None:
                self._backlog = deque(e for e in self._backlog if not e.droppable)
                self._size = sum(len(e.data) for e in self._backlog)
                self._asked = whole
            data = text.encode()
            self._backlog.append(Pending(data, droppable=not keep))
            self._size += len(data)
            self._flush_locked()
            if self._size > BACKLOG_BYTES:
                self._fail_locked(f"it does not read: its pipe is full and {self._size} bytes wait")

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        while self._backlog and self.failed is None:
            entry = self._backlog[0]
            data = entry.data
            try:
                written = os.write(self._fd, data)
            except BlockingIOError:
                return
            except OSError as exc:  # EPIPE: it exited
                self._fail_locked(f"it stopped: {exc}")
                return
            self._size -= written
            if written < len(data):
                entry.data, entry.droppable = data[written:], False
                return
            self._backlog.popleft()

    def _fail_locked(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            self._backlog.clear()
            self._size = 0
            self._wake.set()

    # ------------------------------------------------------------------ reading

    def _read(self, stdout: IO[bytes], on_line: OnLine) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in stdout:
                words = raw.decode(errors="replace").split()
                if len(words) == 2 and words[0] == "ok":
                    with self._lock:
                        if words[1] == self._asked:
                            self._asked = None
                            self.silent = 0.0
                on_line(self, words)
        self.ended.set()
        self._wake.set()

    # ------------------------------------------------------------------ judging

    def trouble(self, gap: float, silent_after: float) -> str | None:
        """Why this process must be replaced (None: it is fine). ``gap``: the
        supervisor's seconds since its last look, counted as silence if a ``=``
        is still unanswered."""
        with self._lock:
            if self.failed is not None:
                return self.failed
        code = self.proc.poll()
        if code is None and self.ended.is_set():  # its output closed: exiting, most likely
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=1.0)
            if code is None:
                return "it closed its output"
        if code is not None:
            return f"it exited with status {code}"
        with self._lock:
            self.silent = self.silent + gap if self._asked is not None else 0.0
            if self.silent >= silent_after:
                return (
                    f"it has not read what the worker sent for {self.silent:.0f}s "
                    "(stopped or wedged)"
                )
        return None

    # ------------------------------------------------------------------ ending

    def kill(self) -> None:
        """SIGKILL (a stopped process too) and reap it."""
        with self._lock:
            self.failed = self.failed or "killed"
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def close(self, timeout: float) -> None:
        """Close its stdin (it exits at EOF) and wait; killed if it does not exit in
        time."""
        with self._lock:
            self._flush_locked()
            self.failed = self.failed or "closed"
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close_pipes(timeout)

    def _close_pipes(self, timeout: float = 5.0) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self._reader.join(timeout=timeout)
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()
