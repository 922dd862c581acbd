"""What a worker's heartbeat process (django_pgjobs/pulse.py) costs: its RSS and CPU
over ``--idle`` seconds of an idle ``runjobs`` and over a drain of ``--n`` no-op jobs,
read from ``/proc`` (Linux), beside the worker's own; and the drain's time with the
process and without it (``PGJOBS_TEST_HEARTBEAT_PROCESS=0``).

Runs against ``$DATABASE_URL`` (migrated) with ``tests.settings`` at the documented
heartbeat defaults (``HEARTBEAT_INTERVAL`` 5 s, ``STALE_AFTER`` 30 s)::

    DATABASE_URL=postgres://... scripts/dev python bench/heartbeat_process.py --idle 60
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument(
    "--idle", type=float, default=60.0, help="seconds of idle worker measured (0: skip)"
)
ap.add_argument("--n", type=int, default=20000, help="no-op jobs per drain")
ap.add_argument("--reps", type=int, default=3, help="drains with and without the process")
A = ap.parse_args()


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds so far, RSS in KiB) of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    rss = next(  # none once it exited (a zombie)
        (
            int(line.split()[1])
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        ),
        0,
    )
    return cpu, rss


def memory(pid: int) -> str:
    """RSS, PSS (shared pages split between their users) and private memory, in MiB."""
    rows = {
        line.split()[0].rstrip(":"): int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    }
    private = rows["Private_Clean"] + rows["Private_Dirty"]
    return f"RSS {rows['Rss'] / 1024:.1f}, PSS {rows['Pss'] / 1024:.1f}, private {private / 1024:.1f} MiB"


def pulse_of(pid: int, deadline: float = 30.0) -> int:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes()
                ppid = int((entry / "stat").read_bytes().rpartition(b")")[2].split()[1])
            except OSError:
                continue
            if ppid == pid and b"django_pgjobs.pulse" in cmd:
                return int(entry.name)
        time.sleep(0.1)
    raise SystemExit(f"no heartbeat process under worker {pid}")


def django(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "django", *args], cwd=ROOT, env=env)


def enqueue(n: int, env: dict[str, str]) -> None:
    code = (
        "import django; django.setup()\n"
        "from tests.testapp.jobs import noop\n"
        f"noop.enqueue_many([()] * {n})\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)


def pending(env: dict[str, str]) -> int:
    code = (
        "import django; django.setup()\n"
        "from django_pgjobs.models import Job\n"
        "print(Job.objects.filter(status__in=['pending', 'running']).count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, check=True, text=True, capture_output=True
    )
    return int(out.stdout)


def drain(env: dict[str, str], with_pulse: bool) -> tuple[float, float]:
    """(seconds, CPU seconds) to drain ``--n`` no-op jobs with one ``runjobs --burst``,
    its start included; the CPU of the worker and of its heartbeat process (which it
    waits for, so ``wait4`` counts it)."""
    env = {**env, "PGJOBS_TEST_HEARTBEAT_PROCESS": "1" if with_pulse else "0"}
    enqueue(A.n, env)
    began = time.monotonic()
    worker = django("runjobs", "--burst", env=env)
    pulse = pulse_of(worker.pid) if with_pulse else None
    peak, cpu = 0, 0.0
    while True:
        pid, _, usage = os.wait4(worker.pid, os.WNOHANG)
        if pid:
            break
        if pulse is not None:
            with contextlib.suppress(OSError):
                cpu, rss = proc_stats(pulse)
                peak = max(peak, rss)
        time.sleep(0.2)
    worker.returncode = 0  # reaped above
    took = time.monotonic() - began
    total = usage.ru_utime + usage.ru_stime
    line = f"drain {'with' if with_pulse else 'without'} the process: {took:.1f}s, CPU {total:.2f}s"
    if with_pulse:
        line += f" (the process: {cpu:.2f}s, RSS peak {peak / 1024:.1f} MiB)"
    print(line)
    return took, total


def idle(env: dict[str, str]) -> None:
    """CPU and memory of an idle worker and of its heartbeat process."""
    worker = django("runjobs", env=env)
    try:
        pulse = pulse_of(worker.pid)
        time.sleep(2)  # past start-up
        cpu0, _ = proc_stats(pulse)
        wcpu0, _ = proc_stats(worker.pid)
        time.sleep(A.idle)
        cpu1, _ = proc_stats(pulse)
        wcpu1, _ = proc_stats(worker.pid)
        print(f"idle {A.idle:.0f}s: heartbeat process CPU {cpu1 - cpu0:.2f}s, {memory(pulse)}")
        print(f"idle {A.idle:.0f}s: worker CPU {wcpu1 - wcpu0:.2f}s, {memory(worker.pid)}")
    finally:
        worker.terminate()
        worker.wait(30)


def main() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "PGJOBS_TEST_HEARTBEAT": "5",
        "PGJOBS_TEST_STALE_AFTER": "30",
    }
    if A.idle:
        idle(env)
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(A.reps):  # interleaved: the box's drift hits both alike
        for with_pulse in (True, False):
            runs[with_pulse].append(drain(env, with_pulse))
    assert pending(env) == 0
    for with_pulse, label in ((True, "with"), (False, "without")):
        wall = statistics.median(r[0] for r in runs[with_pulse])
        cpu = statistics.median(r[1] for r in runs[with_pulse])
        print(
            f"median of {A.reps} drains of {A.n} {label} the process: {wall:.2f}s, CPU {cpu:.2f}s"
        )


if __name__ == "__main__":
    main()
