"""The heartbeat process is supervised (django_pgjobs/worker/pulse_link.py): one that
stops reading never stops its worker, and one that stops, dies or cannot start is
replaced; while the worker runs without one, its health file, its worker row and
``jobs_status`` say so (docs/explanation/heartbeats-and-fencing.md).

Real ``runjobs`` processes, real heartbeat processes and real signals.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from django_pgjobs.db.reap import job_reap_stale
from django_pgjobs.models import Job
from django_pgjobs.models import Worker as WorkerRow
from tests.conftest import ROOT, WorkerProcess, wait_until
from tests.helpers.heartbeat import (
    HOLD_ON_CUE,
    STALE_AFTER,
    TIMINGS,
    db_clock,
    gone,
    job_row,
    pulse_of,
    running_on,
)
from tests.testapp import core_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True)

Start = Callable[..., WorkerProcess]

#: Jobs enqueued while the heartbeat process is stopped: their "+" lines alone are
#: more than its pipe holds (64 KiB), so a worker whose writes block wedges.
FLOOD = 8000


def replaced(worker: WorkerProcess, old: int) -> int | None:
    """The worker's heartbeat process, once it is another than ``old``."""
    pid = pulse_of(worker.pid)
    return pid if pid is not None and pid != old else None


@pytest.mark.process
def test_a_stopped_heartbeat_process_does_not_stop_claims(start_worker: Start) -> None:
    w = start_worker("--concurrency", "4", env=TIMINGS)
    frozen = wait_until(lambda: pulse_of(w.pid), timeout=30, message="its heartbeat process")
    wait_until(lambda: WorkerRow.objects.filter(pid=w.pid).exists(), timeout=30, message="its row")
    os.kill(frozen, signal.SIGSTOP)
    try:
        jobs.noop.enqueue_many([() for _ in range(FLOOD)])
        wait_until(
            lambda: Job.objects.filter(status="completed").count() == FLOOD,
            timeout=120,
            interval=0.5,
            message=f"{FLOOD} jobs drained with the heartbeat process stopped",
        )
        fresh = wait_until(lambda: replaced(w, frozen), timeout=60, message="a new process")
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed by its worker, or not yet
            os.kill(frozen, signal.SIGCONT)
    assert Job.objects.count() == FLOOD
    assert not Job.objects.exclude(attempts=1, lease=1).exists(), "a job was reaped"
    assert WorkerRow.objects.filter(pid=w.pid).exists(), "the worker row was forgotten"
    wait_until(lambda: gone(frozen), timeout=10, message="the stopped process killed")
    assert pulse_of(w.pid) == fresh
    out = w.output()
    assert f"heartbeat process {frozen} dropped" in out, out[-3000:]
    assert f"heartbeat process restarted (pid {fresh})" in out, out[-3000:]
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0, w.output()[-3000:]


@pytest.mark.process
def test_a_killed_heartbeat_process_is_back_within_10_s_and_beats_the_jobs(
    start_worker: Start, tmp_path: Path
) -> None:
    """Killed while a job runs; its replacement is handed the job, and beats it while
    the job then holds the GIL past STALE_AFTER (the worker's thread cannot)."""
    holder = core_jobs.holds_gil_on_cue.enqueue(str(tmp_path), HOLD_ON_CUE)
    w = start_worker("--concurrency", "2", "--no-maintenance", env=TIMINGS)
    wait_until(lambda: running_on(holder, w), timeout=60, message="the job running")
    first = wait_until(lambda: pulse_of(w.pid), timeout=30, message="its heartbeat process")
    os.kill(first, signal.SIGKILL)
    killed = time.monotonic()
    second = wait_until(lambda: replaced(w, first), timeout=10, message="a new process")
    assert time.monotonic() - killed < 10
    wait_until(lambda: "heartbeat process restarted" in w.output(), message="said")
    (tmp_path / "go").touch()
    wait_until((tmp_path / "holding").exists, timeout=30, message="the GIL taken")
    held = db_clock()  # from here only the heartbeat process can beat
    wait_until(
        lambda: db_clock() - held > STALE_AFTER + 0.5,
        timeout=30,
        message="STALE_AFTER to pass while the GIL is held",
    )
    assert not (tmp_path / "released").exists(), "the GIL was let go too soon"
    assert pulse_of(w.pid) == second
    reaped = [r[0] for r in job_reap_stale(connection, stale_after=STALE_AFTER)]
    assert reaped == [], f"reaped from the live worker: {reaped}"
    assert job_row(holder).heartbeat_at.timestamp() > held + 1, "not beaten while held"
    done = wait_until(
        lambda: job_row(holder).status == "completed" and job_row(holder),
        timeout=60,
        message="the job completed",
    )
    assert (done.attempts, done.lease, done.errors) == (1, 1, [])
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0, w.output()[-3000:]


def probe(path: Path) -> tuple[int, str]:
    """``python -m django_pgjobs.health PATH``: (exit status, what it printed)."""
    done = subprocess.run(
        [sys.executable, "-m", "django_pgjobs.health", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def jobs_status(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("jobs_status", *args, stdout=out, stderr=io.StringIO())
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


@pytest.mark.process
def test_a_worker_without_its_heartbeat_process_says_it_is_degraded(
    start_worker: Start, tmp_path: Path
) -> None:
    """Its heartbeat process dies at once, start after start (tests/faults/
    pulse_faults.py, ``down_while``): the probe passes and says degraded, the worker
    row and ``jobs_status`` say so (a warning: ``--check`` fails); once a process
    runs again, all three say nothing."""
    down = tmp_path / "pulse-down"
    down.touch()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"down_while": str(down)}))
    health = tmp_path / "alive"
    env = {**TIMINGS, "PGJOBS_FAULT_PLAN": str(plan)}
    w = start_worker("--concurrency", "1", "--health-file", str(health), env=env)

    def said_degraded() -> bool:
        code, text = probe(health)
        return code == 0 and "degraded: heartbeat process" in text

    wait_until(said_degraded, timeout=30, interval=0.2, message="the probe saying degraded")
    row = WorkerRow.objects.get(pid=w.pid)
    assert "exited with status 3" in row.degraded, row.degraded
    code, text = jobs_status("--check")
    assert code == 1 and "DEGRADED: heartbeat process" in text, text
    assert "runs without its heartbeat process" in text, text
    down.unlink()
    faulty = b"tests.faults.pulse_faults"  # the module a worker under a plan runs
    back = wait_until(
        lambda: pulse_of(w.pid, faulty), timeout=90, message="a process running again"
    )
    wait_until(
        lambda: not WorkerRow.objects.get(pid=w.pid).degraded,
        timeout=30,
        message="the row not degraded",
    )
    wait_until(lambda: "degraded" not in probe(health)[1], timeout=30, message="probe plain")
    code, text = jobs_status()
    assert "DEGRADED" not in text and "runs without" not in text, text
    assert pulse_of(w.pid, faulty) == back
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0, w.output()[-3000:]
