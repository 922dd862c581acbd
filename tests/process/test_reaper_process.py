"""``reap_jobs`` as its own process: its loop keeps reaping until interrupted (the
reaper in-process: tests/db/test_reaper.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.db import connection

from django_pgjobs.models import Job
from tests.conftest import ROOT, wait_until
from tests.helpers.rows import make_job


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_reap_jobs_loop_keeps_reaping_until_interrupted() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "PGJOBS_WORKER_DB_NAME": connection.settings_dict["NAME"],
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "reap_jobs", "--loop"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        first = make_job("running", heartbeat_age=60)
        wait_until(lambda: Job.objects.get(id=first.id).status == "pending", message="1st reap")
        second = make_job("running", heartbeat_age=60)
        wait_until(lambda: Job.objects.get(id=second.id).status == "pending", message="2nd reap")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert b"reaped 1 job(s) (pending=1)" in proc.stdout.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
