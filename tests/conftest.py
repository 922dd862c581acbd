"""Shared fixtures: a second connection, subprocess workers, waiting with deadlines."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from tests.dbrig import use_chosen_database

ROOT = Path(__file__).resolve().parent.parent

# A shell starts a background command (`scripts/dev test &`, nohup, a CI script's
# legs) with SIGINT ignored, and an ignored signal is inherited across exec: the
# runjobs and reap_jobs processes that tests stop with SIGINT would not stop. The
# test run takes SIGINT back (Python's handler here, the default in its children).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: The tiers are folders of tests/, from the fastest: unit (no database), db (the
#: database, in-process), process (real runjobs processes and scripts), browser
#: (headless Chromium), faults (the fault suite). The fixtures they share live here,
#: the other helpers in tests/helpers/.
TIERS = ("unit", "db", "process", "browser", "faults")
#: The fixtures that reach the test database.
DB_FIXTURES = {"db", "transactional_db", "django_db_setup", "live_server", "admin_client"}


def tier_errors(items: list[pytest.Item]) -> list[str]:
    """Each test that sits in the wrong tier, and why: a unit test that reaches the
    database, a ``process`` or ``browser`` test outside the tiers that run them, a
    test outside the tiers' folders."""
    errors = []
    for item in items:
        parts = Path(str(item.path)).relative_to(ROOT).parts
        if parts[0] != "tests":
            continue
        tier = parts[1] if len(parts) > 2 else None
        if tier not in TIERS:
            errors.append(f"{item.nodeid}: not in a tier's folder (tests/{'|'.join(TIERS)})")
        elif tier == "unit" and (
            item.get_closest_marker("django_db")
            or DB_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            errors.append(f"{item.nodeid}: reaches the database; its tier is tests/db")
        elif item.get_closest_marker("process") and tier not in ("process", "browser", "faults"):
            errors.append(f"{item.nodeid}: marked process; its tier is tests/process")
        elif item.get_closest_marker("browser") and tier != "browser":
            errors.append(f"{item.nodeid}: marked browser; its tier is tests/browser")
    return errors


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test in the wrong tier stops the run, naming it: `scripts/dev test` runs the
    fast tiers by folder, and the unit tier runs with no database at all."""
    errors = tier_errors(items)
    if errors:
        raise pytest.UsageError("tests in the wrong tier:\n  " + "\n  ".join(errors))


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """Choose (and start) the database server when a test first needs the database,
    just before pytest-django creates the test database (see tests/dbrig.py)."""
    use_chosen_database()


def examples(n: int) -> int:
    """``n`` Hypothesis examples, scaled by ``PGJOBS_PROPERTY_SCALE`` (default 1; CI's
    Python x Django pair legs use fewer: the full count runs in the main leg)."""
    return max(5, round(n * float(os.environ.get("PGJOBS_PROPERTY_SCALE", "1"))))


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def run_burst_worker(worker: Any, timeout: float = 30.0) -> int:
    """Run ``worker`` (a ``--burst`` ``Worker``) to its end in a thread and return its
    exit code; past ``timeout`` stop it and fail, saying what it still held."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.request_stop()
        thread.join(10)
        raise AssertionError(
            f"the burst worker hung: {worker.counts}, in flight {worker.inflight.ids()}"
        )
    return codes[0]


def manage(
    *argv: str, db: str | None = None, settings: str = "tests.settings", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m django ARGV`` as a user runs it, on database ``db`` (default: the
    test database)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings,
        "PYTHONPATH": str(ROOT),
        "PGJOBS_WORKER_DB_NAME": db or connection.settings_dict["NAME"],
    }
    return subprocess.run(
        [sys.executable, "-m", "django", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dsn() -> str:
    """A libpq DSN for the test database (for connections outside Django's)."""
    params = connection.get_connection_params()
    keys = ("host", "port", "user", "password", "dbname")
    return " ".join(f"{k}='{params[k]}'" for k in keys if params.get(k) not in (None, ""))


@pytest.fixture
def other_connection(transactional_db: Any) -> Iterator[psycopg.Connection]:
    """A second, independent autocommit connection to the test database."""
    with psycopg.connect(dsn(), autocommit=True) as conn:
        yield conn


@pytest.fixture
def scratch_db(other_connection: psycopg.Connection) -> Iterator[Callable[[], str]]:
    """Create empty databases on demand; dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        name = f"{connection.settings_dict['NAME']}_scratch{len(made)}"
        other_connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        other_connection.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return name

    yield make
    for name in made:
        other_connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def table() -> Iterator[str]:
    """A table ``left_open`` for jobs to write in, dropped after the test (a transaction
    left open on it fails the drop rather than hanging it)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE left_open (n int)")
    yield "left_open"
    # async jobs' shared ORM connection outlives the test (no request ends on its
    # thread); closed, the test database can be dropped
    asyncio.run(sync_to_async(lambda: connection.close(), thread_sensitive=True)())
    with connection.cursor() as cursor:
        # a transaction left open holds the table: fail here rather than hang
        cursor.execute("SET lock_timeout = '10s'")
        cursor.execute("DROP TABLE left_open")
        cursor.execute("RESET lock_timeout")


def reset_tracer_provider() -> None:
    # The API lets a process set its provider once; tests need a fresh one each.
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans of the test's process, in memory (OpenTelemetry's SDK exporter)."""
    reset_tracer_provider()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    reset_tracer_provider()


class WorkerProcess:
    """A real ``manage.py runjobs`` subprocess on the test database."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runjobs", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
def start_worker(transactional_db: Any, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``runjobs`` subprocesses against the test database; all are killed afterwards."""
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PGJOBS_WORKER_DB_NAME": connection.settings_dict["NAME"],
            "PYTHONPATH": str(ROOT),
            "PGAPPNAME": WORKER_APPLICATION,
            **(env or {}),
        }
        worker = WorkerProcess(list(args), full_env, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
    if started:
        end_backends(WORKER_APPLICATION)


#: The ``application_name`` of every connection a started worker (and its heartbeat
#: process) opens, so the fixture can find the backends they leave behind.
WORKER_APPLICATION = "pgjobs-test-worker"


def end_backends(application_name: str, timeout: float = 15.0) -> None:
    """End the server backends of killed clients before the database is flushed.

    A SIGKILLed client's backend runs its last statement to the end; one holding a
    table's lock while the flush's TRUNCATE takes them one by one deadlocks it
    (CI: "Database ... couldn't be flushed")."""
    sql = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = %s"
    )

    def ended() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(sql, [application_name])
            return cursor.fetchone()[0] == 0

    wait_until(ended, timeout=timeout, message="the killed workers' backends to end")
