"""The liveness probe says what a supervisor needs: a bad ``--max-age`` is refused, an
unwritable ``--health-file`` stops ``runjobs`` at start, and a worker whose every slot
is stuck goes stale although its heartbeat is fresh (real ``runjobs`` processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_pgjobs.health.health_file import main as health_main
from django_pgjobs.health.health_file import probe
from django_pgjobs.models import Job
from tests.conftest import ROOT, WorkerProcess, wait_until
from tests.testapp.jobs import add, sleep_then_mark


def old_file(tmp_path: Path, age: float) -> Path:
    path = tmp_path / "alive"
    path.touch()
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def stop_cleanly(worker: WorkerProcess) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


def with_health_file(
    start_worker: Callable[..., WorkerProcess], path: Path, *, concurrency: int, stuck_after: int
) -> WorkerProcess:
    return start_worker(
        "--health-file",
        str(path),
        "--concurrency",
        str(concurrency),
        "--no-maintenance",
        env={"PGJOBS_TEST_HEALTH_STUCK_AFTER": str(stuck_after)},
    )


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "-5", "0", "soon"])
def test_a_max_age_that_passes_everything_is_refused(tmp_path: Path, bad: str, capsys: Any) -> None:
    path = old_file(tmp_path, 7200)
    with pytest.raises(SystemExit) as raised:
        health_main([str(path), f"--max-age={bad}"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "argument --max-age: must be a finite number of seconds above 0" in err
    assert repr(bad) in err


def test_the_probe_process_refuses_nan_and_judges_age(tmp_path: Path) -> None:
    path = old_file(tmp_path, 7200)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "django_pgjobs.health", str(path), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = run("--max-age", "nan")
    assert refused.returncode == 2 and "--max-age" in refused.stderr, refused.stderr
    stale = run("--max-age", "60")
    assert stale.returncode == 1, stale.stderr
    assert re.search(r"is 72\d\ds old \(limit 60s\)", stale.stderr), stale.stderr
    assert run("--max-age", "9000").returncode == 0
    # probe() called from code with nan fails too, rather than passing every file.
    assert probe(str(path), float("nan"))[0] is False


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("path", "error"),
    [("/nonexistent/x", "No such file or directory"), ("/proc/pgjobs-alive", None)],
)
def test_an_unwritable_health_file_stops_runjobs_at_start(
    start_worker: Callable[..., WorkerProcess], path: str, error: str | None
) -> None:
    worker = start_worker("--health-file", path, "--no-maintenance")
    assert worker.wait(60) == 2, worker.output()
    lines = [line for line in worker.output().splitlines() if "--health-file" in line]
    assert len(lines) == 1, worker.output()
    assert lines[0].startswith(f"runjobs: --health-file {path}: cannot write it (")
    if error:
        assert error in lines[0]
    assert "Traceback" not in worker.output()
    assert not os.path.exists(path)


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_an_existing_stale_file_is_not_refreshed_by_the_start_check(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """The writability check must not make a previous run's stale file look fresh:
    the file is touched only once this worker's heartbeat is in the database."""
    path = old_file(tmp_path, 3600)
    before = path.stat().st_mtime
    worker = start_worker("--health-file", str(path), "--no-maintenance")
    wait_until(
        lambda: path.exists() and path.stat().st_mtime > before,
        timeout=60,
        message="the health file touched by the running worker: " + worker.output(),
    )
    stop_cleanly(worker)


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_every_slot_is_stuck_goes_stale(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """One slot, stuck in a 25 s job, with 30 jobs waiting: the heartbeat stays fresh
    but the health file is no longer touched, the probe fails, and the log says why;
    once the job ends the file is touched again."""
    path = tmp_path / "alive"
    sleep_then_mark.enqueue(25, str(tmp_path / "slept"))
    worker = with_health_file(start_worker, path, concurrency=1, stuck_after=3)
    wait_until(path.exists, timeout=60, message="the health file: " + worker.output())
    for i in range(30):
        add.enqueue(i, i)
    wait_until(
        lambda: "have run the same jobs for over 3s" in worker.output(),
        timeout=60,
        message="the stuck-slot warning: " + worker.output(),
    )
    line = next(x for x in worker.output().splitlines() if "for over 3s" in x)
    assert "all 1 job threads" in line and "HEALTH_STUCK_AFTER" in line
    stuck_since = path.stat().st_mtime
    # The heartbeat (interval 0.5 s in tests) would have touched it many times by now.
    wait_until(
        lambda: time.time() - path.stat().st_mtime > 4,
        timeout=30,
        message="the health file to go stale",
    )
    assert path.stat().st_mtime == stuck_since
    assert health_main([str(path), "--max-age", "4"]) == 1
    # The job ends (25 s): the slot works again, the file is touched again.
    wait_until(
        lambda: time.time() - path.stat().st_mtime < 2,
        timeout=90,
        message="the health file touched again: " + worker.output(),
    )
    wait_until(  # logged just after the touch
        lambda: "touched again" in worker.output(),
        timeout=10,
        message="the log's 'touched again': " + worker.output(),
    )
    stop_cleanly(worker)


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_busy_worker_with_a_free_slot_stays_alive(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """Two threads, one stuck: the other still runs jobs, so the file stays fresh."""
    path = tmp_path / "alive"
    sleep_then_mark.enqueue(16, str(tmp_path / "slept"))
    worker = with_health_file(start_worker, path, concurrency=2, stuck_after=2)
    wait_until(
        lambda: Job.objects.filter(status="running").exists() and path.exists(),
        timeout=60,
        message="the long job running: " + worker.output(),
    )
    for _ in range(10):  # 8 s past the bound: touched all along (5 s of slack for load)
        time.sleep(1)
        assert time.time() - path.stat().st_mtime < 5, worker.output()
    assert "have run the same jobs" not in worker.output()
    worker.signal(signal.SIGTERM)
    worker.wait(30)


@pytest.mark.django_db(transaction=True)
def test_the_file_needs_a_fresh_heartbeat_and_a_working_slot(tmp_path: Path) -> None:
    """In process: no worker row (or a stale one) never touches the file, whatever the
    slots say; a fresh row touches it unless every slot is stuck."""
    from datetime import timedelta

    from django.utils import timezone

    from django_pgjobs.health.health_file import HealthFile
    from django_pgjobs.models import Worker

    path = tmp_path / "alive"
    problem: list[str | None] = [None]
    asked = []

    def stuck() -> str | None:
        asked.append(1)
        return problem[0]

    health = HealthFile(str(path), worker_id="w-health", alias="default", stuck=stuck)
    Worker.objects.create(
        id="w-health", host="h", pid=1, concurrency=1, last_seen=timezone.now() - timedelta(hours=1)
    )
    health.start()
    try:
        time.sleep(2)  # four heartbeat intervals (0.5 s in tests): a negative needs time
        assert not path.exists() and not asked  # a stale heartbeat: never touched
        problem[0] = "every slot stuck"
        Worker.objects.filter(pk="w-health").update(last_seen=timezone.now() + timedelta(hours=1))
        wait_until(lambda: len(asked) >= 3, timeout=30, message="the slot check")
        assert not path.exists()
        problem[0] = None
        wait_until(path.exists, timeout=30, message="the file once a slot works")
    finally:
        health.stop()
    assert not path.exists()
