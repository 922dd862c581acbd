"""The heartbeat process: keeps a worker's jobs alive while the worker cannot.

A job that holds the GIL in one long C call (a regular expression that backtracks,
a C extension that never releases it) stops every other thread of its worker,
the heartbeat thread too; the reaper would take a live worker for dead and run its
jobs again (a worker that is alive is never taken for dead:
docs/explanation/guarantees.md). So each
worker starts this small process (``python -m django_pgjobs.pulse``, launched and
fed by ``worker/pulse_link.py``): another interpreter, its own GIL, its own
connection. It imports psycopg and the standard library only (no Django), so it
starts fast and stays small.

It stands in for the worker's heartbeat thread, not beside it: the thread sends
its set after each beat it made, with the moment the beat began (the rows hold
that moment, so a beat slow under load counts from its start); only when 1.5
intervals passed since the worker's last beat began does this process beat itself (its statements handed over at start, from ``db/``),
for the last (job id, lease) set the worker sent. A job just claimed is sent
(``+``) before it can start, so a job that takes the GIL at once is covered. A
claim whose reply arrives while another job holds the GIL cannot be sent: its rows
are committed, running, and known to nobody in the worker. So the beat also takes
every running row claimed under the worker's id that it was not told of
(``JOB_HEARTBEAT_PULSE``), and beats it from then on like the others.

It is alive exactly as long as its worker: it exits when the worker dies (Linux's
parent-death signal, a changed parent pid, EOF on stdin), and it does not beat
while the worker is stopped (SIGSTOP, a debugger: ``/proc/<pid>/stat`` state
``T``/``t``), so a frozen worker is still taken for dead.

The worker supervises it (``worker/pulse_link.py``): a process that dies, or stops
answering, is replaced, and the replacement is handed the whole set at start. So
each ``=`` line is answered (``ok @started``) as soon as it is read: the worker
tells a process that reads from one that does not (stopped, starved, wedged).

Protocol, one line each. In (stdin): a JSON object first (connection parameters,
the statements that set the session up (``SET ROLE``), interval, statements, the
worker row's parameters, the health file to touch after a beat, the leases in
flight), then ``+ id lease`` (claimed), ``= @started id:lease,...`` (the whole set
after a beat that began at ``started``, ``time.monotonic()``). Out (stdout):
``ready``, ``ok @started`` for each ``=``, ``lost id lease`` for each lease its
beat found lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from typing import Any

#: Linux prctl option: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1
#: Beat when the worker's own heartbeat is this many intervals late.
LATE = 1.5
#: Seconds (at most a quarter interval) before importing psycopg and connecting.
START_DELAY = 1.0


def die_with_parent(parent: int) -> None:
    """Get SIGKILL when the worker dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(0)


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, job control, a tracer): a frozen worker."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


class Pulse:
    """The leases the worker holds, beaten when the worker is late."""

    def __init__(self, config: dict[str, Any], out: Any):
        self.config = config
        self.interval = float(config["interval"])
        self.parent = int(config["parent"])
        self.out = out
        # a replacement starts with the set its predecessor had
        self.leases: dict[int, int] = {int(j): int(lease) for j, lease in config.get("leases", ())}
        self.lock = threading.Lock()
        self.out_lock = threading.Lock()  # the reader's answers and the beat's reports
        self.last = time.monotonic()  # when the worker's last beat began, or our last beat
        self.eof = threading.Event()
        self.conn: Any = None
        self.failing_since: float | None = None
        self.heard = self.last  # the worker's last word
        self.touching: bool | None = None  # keep the health file fresh in this silence?
        self.said = 0.0

    def read(self, lines: Any) -> None:
        """The worker's messages, until EOF (the worker closed the pipe or died)."""
        for line in lines:
            kind, _, rest = line.strip().partition(" ")
            started = ""
            with self.lock:
                if kind == "+":
                    job, lease = rest.split()
                    self.leases[int(job)] = int(lease)
                elif kind == "=":
                    started, _, rest = rest.partition(" ")
                    pairs = (p.split(":") for p in rest.split(",") if p)
                    self.leases = {int(j): int(lease) for j, lease in pairs}
                    self.heard_now(float(started.removeprefix("@")))
            if kind == "=":
                self.answer(f"ok {started}\n")
        self.eof.set()

    def answer(self, text: str) -> None:
        """Tell the worker this process reads: it replaces one that does not."""
        if self.out is None:
            return
        with self.out_lock:
            self.out.write(text)
            self.out.flush()

    def heard_now(self, started: float) -> None:
        """The worker beat, beginning at ``started``: its own thread keeps time (and
        the health file) again, counted from when its beat began."""
        self.last = self.heard = min(started, time.monotonic())
        self.touching = None

    def due(self) -> bool:
        """Time to beat: LATE intervals after the worker's last beat began; once this
        process beats in the worker's stead (its own beat was the last), every
        interval."""
        wait = self.interval if self.last != self.heard else LATE * self.interval
        return time.monotonic() - self.last >= wait

    def run(self) -> None:
        # Connected from the start: when the worker needs us, a connection is there
        # (not one more to win from a full server at the worst moment).
        with contextlib.suppress(Exception):
            self.connect()
        while not self.eof.wait(self.interval / 4):
            if os.getppid() != self.parent:
                return
            if stopped(self.parent) or not self.due():
                continue
            self.last = time.monotonic()  # beat or not, the next try in an interval
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - idle for long, the connection may be gone
                self.close()
                try:
                    self.beat()
                except Exception as exc:  # noqa: BLE001 - again at the next interval
                    self.failed(exc)
                    self.close()
                    continue
            if self.failing_since is not None:
                self.say("beats again")
                self.failing_since = None

    def failed(self, exc: Exception) -> None:
        """Said at the first failure, then at most once a minute (the worker's log)."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = self.said = now
            self.say(f"beat failed: {exc}")
        elif now - self.said >= 60:
            self.said = now
            self.say(f"beat failing for {now - self.failing_since:.0f}s: {exc}")

    def say(self, text: str) -> None:
        print(f"pgjobs heartbeat process of pid {self.parent}: {text}", file=sys.stderr)
        sys.stderr.flush()

    def connect(self) -> Any:
        import psycopg

        if self.conn is None:
            conn = psycopg.connect(**self.config["connection"], autocommit=True)
            try:
                for statement in self.config.get("setup", ()):  # SET ROLE, as Django's
                    conn.execute(statement)
            except BaseException:
                conn.close()
                raise
            self.conn = conn
        return self.conn

    def beat(self) -> None:
        """The jobs the worker told of, and those it claimed but could not tell of yet
        (adopted: its claim committed while a job held its GIL), then its row."""
        conn = self.connect()
        with self.lock:
            items = list(self.leases.items())
        params = {
            "ids": [i[0] for i in items],
            "leases": [i[1] for i in items],
            "worker": self.config["worker_row"]["id"],
        }
        rows = conn.execute(self.config["heartbeat"], params).fetchall()
        lost = [(job, lease) for job, lease, adopted in rows if not adopted]
        found = [(job, lease) for job, lease, adopted in rows if adopted]
        # "degraded": empty, as this process beats (its worker is not without one)
        conn.execute(self.config["worker_upsert"], {**self.config["worker_row"], "degraded": ""})
        self.touch()
        with self.lock:  # said once: no more beats for a lost lease (the output stays small)
            for job, lease in lost:
                if self.leases.get(job) == lease:
                    del self.leases[job]
            for job, lease in found:  # leases only grow: a newer "+" meanwhile stays
                if self.leases.get(job, lease - 1) < lease:
                    self.leases[job] = lease
        if found:
            self.say(
                f"beat for {len(found)} job(s) claimed that the worker had not sent yet"
                f" ({', '.join(str(job) for job, _ in found)}): its claim's reply waits"
                " for the GIL"
            )
        with self.out_lock:
            for job, lease in lost:
                self.out.write(f"lost {job} {lease}\n")
            self.out.flush()

    def touch(self) -> None:
        """``runjobs --health-file``, after a beat (the worker row is fresh): kept fresh
        only if it was fresh when the worker fell silent (a worker whose slots were
        stuck had let it go stale: it stays so), and for at most ``touch_for`` seconds
        of silence (``HEALTH_STUCK_AFTER``: silent that long is stuck too)."""
        path, bound = self.config.get("touch"), self.config.get("touch_for")
        if not path:
            return
        with contextlib.suppress(OSError):
            if self.touching is None:  # the first beat of this silence
                age = time.time() - os.stat(path).st_mtime
                self.touching = age <= (LATE + 2) * self.interval + 1
            if self.touching and (bound is None or time.monotonic() - self.heard < bound):
                os.utime(path)

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


def main() -> int:
    config = json.loads(sys.stdin.readline() or "null")
    if not isinstance(config, dict):
        return 0  # the worker went away before saying anything
    die_with_parent(int(config["parent"]))
    pulse = Pulse(config, sys.stdout)
    threading.Thread(target=pulse.read, args=(sys.stdin,), daemon=True).start()
    # psycopg's import and the connection cost CPU, so they wait a little: a
    # worker's first second is often a backlog's drain, where two workers' processes
    # starting at once slow it on a small box; this process is not
    # needed before LATE intervals of its worker's silence anyway.
    if pulse.eof.wait(min(START_DELAY, pulse.interval / 4)):
        return 0
    import psycopg  # noqa: F401 - fail here, where the worker hears of it (no "ready")

    pulse.answer("ready\n")
    try:
        pulse.run()
    finally:
        pulse.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
