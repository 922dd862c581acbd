"""Timings and process probes for the tests of the heartbeat process (``/proc`` read
directly: the process is a real child of a real worker)."""

from __future__ import annotations

from pathlib import Path

from django.db import connection

from django_pgjobs.models import Job
from tests.conftest import WorkerProcess

#: The process beats once its worker is 0.75 s late (a heartbeat every 0.5 s). On a
#: loaded two-core box a beat may land seconds late, so STALE_AFTER 5 s keeps the point
#: (a call far longer than STALE_AFTER) with a margin for the box, not the GIL.
STALE_AFTER = 5.0

TIMINGS = {"PGJOBS_TEST_STALE_AFTER": str(STALE_AFTER), "PGJOBS_TEST_HEARTBEAT": "0.5"}

#: How long the job holds the GIL in one call, at least (about twice that at most).
HOLD = STALE_AFTER + 1.5


def pulse_of(pid: int, module: bytes = b"django_pgjobs.pulse") -> int | None:
    """The pid of the heartbeat process whose parent is ``pid`` (None: none yet)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rpartition(b")")[2].split()
        if int(fields[1]) == pid and module in cmdline and fields[0] != b"Z":
            return int(entry.name)
    return None


def gone(pid: int) -> bool:
    """Exited (or a zombie nobody reaped yet: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0] == b"Z"
    except OSError:
        return True


def job_row(job: Job) -> Job:
    return Job.objects.get(id=job.id)


def running_on(job: Job, worker: WorkerProcess) -> bool:
    row = job_row(job)
    return row.status == "running" and f":{worker.pid}:" in (row.worker or "")


#: How long the cued job holds the GIL: the claim, then STALE_AFTER and more.
HOLD_ON_CUE = int(STALE_AFTER) + 6  # whole seconds: libc sleep()


def db_clock() -> float:
    """The database's clock (epoch seconds): what heartbeats and the reaper go by."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
        return float(cursor.fetchone()[0])
