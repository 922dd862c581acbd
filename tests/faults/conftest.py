"""The fault-suite rig: a throwaway PostgreSQL cluster, real ``runjobs``
subprocesses, a real pgbouncer, and helpers that read outcomes from the database.

Everything under tests/faults is marked ``faults`` (run alone with ``-m faults``).
The cluster is started once per session (initdb/pg_ctl from the machine's
PostgreSQL binaries, on a free port, as user postgres) and migrated by running
``python -m django migrate`` against it; each test starts from empty tables.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, WorkerProcess, wait_until
from tests.helpers.cluster import TempCluster, free_port

DBNAME = "faults"
PGBOUNCER = "/usr/sbin/pgbouncer"

#: Worker timings used by the suite (also in tests/settings.py's env knobs).
HEARTBEAT = 0.5
STALE_AFTER = 2.0
REAPER_INTERVAL = 0.5


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark everything here ``faults``; leave ``soak`` tests out unless ``-m`` names soak."""
    here = Path(__file__).parent
    soak_selected = "soak" in (config.option.markexpr or "")
    keep, dropped = [], []
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)
            if item.get_closest_marker("soak") and not soak_selected:
                dropped.append(item)
                continue
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS fault_effects (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    lease bigint NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    phase text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def django_env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PGJOBS_WORKER_DB_NAME"}
    env.update(
        {
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            **extra,
        }
    )
    return env


@pytest.fixture(scope="session")
def cluster() -> Iterator[TempCluster]:
    try:
        # log_lock_waits / deadlock reports land in server.log, which tests grep.
        c = TempCluster(
            name="faults",
            conf={
                "log_min_messages": "warning",
                "max_connections": "200",
                "deadlock_timeout": "'200ms'",
            },
        )
    except RuntimeError as exc:
        pytest.skip(f"fault suite needs PostgreSQL server binaries: {exc}")
    c.start()
    try:
        c.create_database(DBNAME)
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v0"],
            cwd=ROOT,
            env=django_env(c.url(DBNAME)),
            check=True,
        )
        with psycopg.connect(c.dsn(DBNAME), autocommit=True) as conn:
            conn.execute(EFFECTS_DDL)
        yield c
    finally:
        c.destroy()


@pytest.fixture
def db(cluster: TempCluster) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the suite's database, on empty tables."""
    with psycopg.connect(cluster.dsn(DBNAME), autocommit=True) as conn:
        conn.execute(
            "TRUNCATE django_pgjobs_job, django_pgjobs_jobstep, django_pgjobs_jobresult, django_pgjobs_worker,"
            " django_pgjobs_queue, django_pgjobs_knowntask, django_pgjobs_workflow,"
            " django_pgjobs_jobdependency, django_pgjobs_heldslot, fault_effects,"
            " django_pgjobs_minute, django_pgjobs_rollupmark, django_pgjobs_jobsignal,"
            " django_pgjobs_jobevent RESTART IDENTITY"
        )
        # as migrated (the statistics cell turns it off: tests/faults/matrix.py)
        conn.execute("ALTER TABLE django_pgjobs_job RESET (autovacuum_enabled)")
        yield conn


class Workers:
    """Starts ``runjobs`` subprocesses on the suite's database; kills them afterwards."""

    def __init__(self, url: str, tmp: Path):
        self.url = url
        self.tmp = tmp
        self.started: list[WorkerProcess] = []
        self.signal_log = tmp / "signals.jsonl"

    def start(self, *args: str, url: str | None = None, **env: str) -> WorkerProcess:
        full_env = django_env(url or self.url, PGJOBS_FAULT_SIGNAL_LOG=str(self.signal_log), **env)
        worker = WorkerProcess(list(args), full_env, self.tmp / f"worker-{len(self.started)}.log")
        self.started.append(worker)
        return worker

    def signals(self) -> list[dict[str, Any]]:
        if not self.signal_log.exists():
            return []
        return [json.loads(line) for line in self.signal_log.read_text().splitlines() if line]

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A scratch folder the worker processes (another user? no: root) can write to."""
    path = Path(tempfile.mkdtemp(prefix="pgjobs-faults-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def workers(
    cluster: TempCluster, db: psycopg.Connection, workdir: Path, request: pytest.FixtureRequest
) -> Iterator[Workers]:
    w = Workers(cluster.url(DBNAME), workdir)
    yield w
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for i, worker in enumerate(w.started):
            state = process_state(worker.pid) if worker.proc.poll() is None else "exited"
            sys.stderr.write(
                f"\n----- worker {i} (pid {worker.pid}, {state}) log -----\n"
                f"{worker.output()[-4000:]}\n"
            )
        sys.stderr.write(f"\n----- the server's sessions at the failure -----\n{sessions(db)}\n")
    w.stop_all()


def sessions(db: psycopg.Connection) -> str:
    """What every backend of the suite's database was doing, and the locks not granted
    (a one-off hang in CI tells its cause in the log)."""
    try:
        rows = db.execute(
            "SELECT a.pid, a.application_name, a.state, a.wait_event_type, a.wait_event,"
            " round(extract(epoch FROM now() - a.xact_start)::numeric, 1) AS xact_s,"
            " left(regexp_replace(a.query, '\\s+', ' ', 'g'), 160),"
            " (SELECT string_agg(l.locktype || ' ' || l.mode, ', ') FROM pg_locks l"
            "   WHERE l.pid = a.pid AND NOT l.granted) AS waiting_for"
            " FROM pg_stat_activity a WHERE a.datname = current_database()"
            " AND a.pid <> pg_backend_pid() ORDER BY a.xact_start NULLS LAST"
        ).fetchall()
    except psycopg.Error as exc:
        return f"(could not read pg_stat_activity: {exc})"
    return "\n".join(" | ".join(str(c) for c in row) for row in rows) or "(none)"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# ---------------------------------------------------------------------------
# Enqueueing and reading rows (psycopg, straight to the table)
# ---------------------------------------------------------------------------

JOB_COLUMNS = (
    "id, task, status, attempts, max_attempts, lease, worker, errors, last_error, "
    "started_at, finished_at, heartbeat_at, run_at, queue, priority, args"
)


def enqueue(
    conn: psycopg.Connection,
    task: str,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    max_attempts: int = 5,
    queue: str = "default",
    priority: int = 0,
    delay: float = 0.0,
) -> int:
    row = conn.execute(
        "INSERT INTO django_pgjobs_job (task, args, kwargs, max_attempts, queue, priority, run_at)"
        " VALUES (%s, %s::jsonb, %s::jsonb, %s, %s, %s, now() + make_interval(secs => %s))"
        " RETURNING id",
        [
            task,
            json.dumps(list(args)),
            json.dumps(kwargs or {}),
            max_attempts,
            queue,
            priority,
            delay,
        ],
    ).fetchone()
    assert row is not None
    conn.execute("SELECT pg_notify('pgjobs', %s)", [queue])
    return int(row[0])


def job_row(conn: psycopg.Connection, job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute(
            f"SELECT {JOB_COLUMNS} FROM django_pgjobs_job WHERE id = %s", [job_id]
        ).fetchone()
    assert row is not None, f"job {job_id} is gone"
    return row


def effects(conn: psycopg.Connection, job_id: int, phase: str | None = None) -> list[tuple]:
    sql = "SELECT lease, attempt, pid, phase FROM fault_effects WHERE job_id = %s"
    params: list[Any] = [job_id]
    if phase:
        sql += " AND phase = %s"
        params.append(phase)
    return conn.execute(sql + " ORDER BY id", params).fetchall()


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(
        conn.execute("SELECT status, count(*) FROM django_pgjobs_job GROUP BY status").fetchall()
    )


def wait_status(
    conn: psycopg.Connection, job_id: int, status: str, timeout: float = 20, **match: Any
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        row = job_row(conn, job_id)
        if row["status"] == status and all(row[k] == v for k, v in match.items()):
            return row
        return None

    return wait_until(check, timeout=timeout, message=f"job {job_id} {status} {match}")


def wait_effect(
    conn: psycopg.Connection, job_id: int, phase: str, lease: int | None = None, timeout: float = 20
) -> None:
    def check() -> bool:
        return any(lease is None or e[0] == lease for e in effects(conn, job_id, phase))

    wait_until(check, timeout=timeout, message=f"job {job_id} effect {phase} lease {lease}")


def go(directory: Path, job_id: int, lease: int) -> None:
    (directory / f"go-{job_id}-{lease}").touch()


def process_state(pid: int) -> str:
    """The one-letter state of a process (T when stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def wait_stopped(pid: int, timeout: float = 20) -> None:
    wait_until(lambda: process_state(pid) == "T", timeout=timeout, message=f"pid {pid} stopped")


def sigkill(worker: WorkerProcess) -> None:
    """SIGKILL the worker's whole process group (works on a stopped process too)."""
    os.killpg(worker.pid, signal.SIGKILL)
    worker.proc.wait(timeout=10)


# ---------------------------------------------------------------------------
# pgbouncer
# ---------------------------------------------------------------------------


class Bouncer:
    """Debian's pgbouncer in transaction mode in front of the suite's cluster."""

    def __init__(self, cluster: TempCluster):
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="pgjobs-bouncer-"))
        self.log = self.root / "pgbouncer.log"
        (self.root / "users.txt").write_text('"postgres" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={cluster.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root}/users.txt\n"
            "pool_mode = transaction\ndefault_pool_size = 20\nmax_client_conn = 500\n"
            f"logfile = {self.log}\n"
        )
        if os.geteuid() == 0:
            for path in (self.root, *self.root.iterdir()):
                shutil.chown(path, "postgres", "postgres")
        cmd = [PGBOUNCER, str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self._answers, timeout=15, message="pgbouncer accepting connections")

    def _answers(self) -> bool:
        try:
            with psycopg.connect(self.dsn(DBNAME), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def bouncer(cluster: TempCluster) -> Iterator[Bouncer]:
    if not os.path.exists(PGBOUNCER):
        print(f"SKIPPED: pgbouncer scenarios need {PGBOUNCER} (apt-get install pgbouncer)")
        pytest.skip(f"pgbouncer scenarios need {PGBOUNCER} (apt-get install pgbouncer)")
    b = Bouncer(cluster)
    yield b
    b.stop()


def deadline_loop(seconds: float) -> Callable[[], bool]:
    end = time.monotonic() + seconds
    return lambda: time.monotonic() < end
