"""A real network partition: worker A runs in its own network
namespace, joined to the host by a veth pair in a private /30; the throwaway
cluster listens on the host side of the pair too. While A's jobs keep running,
the link is taken down (no FIN, no RST: A's connections are half-open, exactly
what a cut cable or a dead switch does). Worker B, on the host, reclaims and
completes A's jobs; when the link returns, A's late writes are fenced, the atomic
job's effects exist once, and A recovers on its own (it completes a job of a
queue only it serves).

A's connection URL carries libpq's TCP settings so a half-open connection is
noticed in seconds instead of the kernel's ~15 minutes of retransmissions:
``keepalives=1&keepalives_idle=1&keepalives_interval=1&keepalives_count=3``
(an idle connection: the LISTEN one) and ``tcp_user_timeout=3000`` (a
connection with unacknowledged data: a heartbeat or completion in flight).

Needs root (``ip netns``); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT, WorkerProcess, wait_until
from tests.faults.conftest import EFFECTS_DDL, django_env, go
from tests.helpers.cluster import TempCluster

pytestmark = pytest.mark.partition

DB = "partition"
STEP = "tests.testapp.jobs.fault_step"
ATOMIC = "tests.testapp.jobs.fault_atomic"
#: libpq settings that make a half-open connection fail fast (see the module docstring).
TCP_OPTIONS = (
    "keepalives=1&keepalives_idle=1&keepalives_interval=1&keepalives_count=3"
    "&tcp_user_timeout=3000&connect_timeout=2"
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Netns:
    """A namespace with one veth pair to the host: host .1, namespace .2 of a /30."""

    name: str
    host_if: str
    host_ip: str
    ns_ip: str

    @classmethod
    def create(cls) -> Netns:
        tag = f"{os.getpid() % 10000}{random.randint(0, 99)}"
        subnet = random.randint(0, 63) * 4
        third = random.randint(1, 254)
        ns = cls(
            f"pgjobs-part-{tag}",
            f"pjh{tag}",
            f"10.213.{third}.{subnet + 1}",
            f"10.213.{third}.{subnet + 2}",
        )
        peer = f"pjn{tag}"
        _ip("netns", "add", ns.name)
        try:
            _ip("link", "add", ns.host_if, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns.name)
            _ip("addr", "add", f"{ns.host_ip}/30", "dev", ns.host_if)
            _ip("link", "set", ns.host_if, "up")
            _ip("-n", ns.name, "addr", "add", f"{ns.ns_ip}/30", "dev", peer)
            _ip("-n", ns.name, "link", "set", peer, "up")
            _ip("-n", ns.name, "link", "set", "lo", "up")
        except subprocess.CalledProcessError:
            ns.destroy()
            raise
        return ns

    def cut(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def destroy(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


@pytest.fixture
def netns() -> Iterator[Netns]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("SKIPPED: the partition drill needs root and iproute2 (ip netns)")
        pytest.skip("the partition drill needs root and iproute2 (ip netns)")
    try:
        ns = Netns.create()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace here: {exc.stderr!r}")
    try:
        yield ns
    finally:
        ns.destroy()


@pytest.fixture
def part_cluster(netns: Netns) -> Iterator[TempCluster]:
    try:
        cluster = TempCluster(
            name="partition",
            conf={"listen_addresses": f"'127.0.0.1,{netns.host_ip}'", "max_connections": "60"},
        )
    except RuntimeError as exc:
        pytest.skip(f"partition drill needs PostgreSQL server binaries: {exc}")
    with open(cluster.data / "pg_hba.conf", "a") as fh:
        fh.write(f"host all all {netns.ns_ip}/32 trust\n")
    cluster.start()
    try:
        cluster.create_database(DB)
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v0"],
            cwd=ROOT,
            env=django_env(cluster.url(DB)),
            check=True,
        )
        with psycopg.connect(cluster.dsn(DB), autocommit=True) as conn:
            conn.execute(EFFECTS_DDL)
        yield cluster
    finally:
        cluster.destroy()


class NsWorker(WorkerProcess):
    """``runjobs`` inside the namespace (``ip netns exec``)."""

    def __init__(self, ns: Netns, args: list[str], env: dict[str, str], log: Path):
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns.name, sys.executable, "-m", "django", "runjobs", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _insert(conn: psycopg.Connection, task: str, queue: str = "default", **kwargs: object) -> int:
    import json

    row = conn.execute(
        "INSERT INTO django_pgjobs_job (task, args, kwargs, queue, run_at) VALUES"
        " (%s, '[]', %s::jsonb, %s, now()) RETURNING id",
        [task, json.dumps(kwargs), queue],
    ).fetchone()
    assert row is not None
    conn.execute("SELECT pg_notify('pgjobs', %s)", [queue])
    return int(row[0])


def test_partitioned_worker_is_fenced_and_recovers(netns: Netns, part_cluster: TempCluster) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="pgjobs-partition-"))
    os.chmod(tmp, 0o777)  # noqa: S103 - a throwaway folder that every process of the drill writes to
    signals_log = tmp / "signals.jsonl"
    a_url = f"postgres://postgres@{netns.host_ip}:{part_cluster.port}/{DB}?{TCP_OPTIONS}"
    b_url = part_cluster.url(DB)
    conn = psycopg.connect(part_cluster.dsn(DB), autocommit=True)
    a = NsWorker(
        netns,
        ["--concurrency", "4", "--queues", "default,only-a"],
        django_env(a_url, PGJOBS_FAULT_SIGNAL_LOG=str(signals_log)),
        tmp / "worker-a.log",
    )
    b: WorkerProcess | None = None
    try:
        # A claims both jobs (B is not running yet) and holds them until told to go.
        atomic = _insert(conn, ATOMIC, dir=str(tmp), wait_go=True)
        step = _insert(conn, STEP, dir=str(tmp), wait_go=True)
        for job in (atomic, step):
            wait_until(
                lambda j=job: (tmp / f"waiting-{j}-1").exists(),
                timeout=30,
                message=f"worker A running job {job}",
            )
        netns.cut()
        b = WorkerProcess(
            ["--concurrency", "4", "--queues", "default"],
            django_env(b_url, PGJOBS_FAULT_SIGNAL_LOG=str(signals_log)),
            tmp / "worker-b.log",
        )
        # The reaper (in B) reclaims both after STALE_AFTER; B runs them (lease 3).
        for job in (atomic, step):
            wait_until(
                lambda j=job: (tmp / f"waiting-{j}-3").exists(),
                timeout=30,
                message=f"worker B running reclaimed job {job}",
            )
            go(tmp, job, 3)
        for job in (atomic, step):
            wait_until(
                lambda j=job: (
                    conn.execute(
                        "SELECT status, lease FROM django_pgjobs_job WHERE id = %s", [j]
                    ).fetchone()
                    == ("completed", 3)
                ),
                timeout=30,
                message=f"B completed job {job}",
            )
        assert a.proc.poll() is None, "worker A died during the partition"
        # Heal; A's handlers finish and try to write their outcomes.
        netns.heal()
        for job in (atomic, step):
            go(tmp, job, 1)

        def fenced() -> set[int]:
            import json

            if not signals_log.exists():
                return set()
            return {
                r["job_id"]
                for r in map(json.loads, signals_log.read_text().splitlines())
                if r["signal"] == "job_fenced"
            }

        # A's late write about the plain job is refused and reported (job_fenced).
        wait_until(lambda: step in fenced(), timeout=60, message="A's late completion fenced")
        # A recovers on its own: it completes a job only it serves.
        fresh = _insert(conn, STEP, queue="only-a")
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT status FROM django_pgjobs_job WHERE id = %s", [fresh]
                ).fetchone()[0]
                == "completed"
            ),
            timeout=60,
            message="worker A completed a job after the partition",
        )
        for job in (atomic, step):  # B's outcome stands
            assert conn.execute(
                "SELECT status, lease FROM django_pgjobs_job WHERE id = %s", [job]
            ).fetchone() == ("completed", 3)
        # The atomic job's effects exist once: A's transaction was rolled back.
        effects = conn.execute(
            "SELECT lease FROM fault_effects WHERE job_id = %s", [atomic]
        ).fetchall()
        assert effects == [(3,)], effects
        # The plain job ran twice (at-least-once) but was completed once, by B.
        step_effects = conn.execute(
            "SELECT lease, phase FROM fault_effects WHERE job_id = %s ORDER BY id", [step]
        ).fetchall()
        assert (3, "end") in step_effects
        assert a.proc.poll() is None and b.proc.poll() is None
        print(
            "\nworker A during and after the partition:\n"
            + "\n".join(
                line
                for line in a.output().splitlines()
                if "lease" in line or "recovered" in line or "database error" in line
            )
        )
    except BaseException:
        sys.stderr.write(f"\n--- worker A ---\n{a.output()[-4000:]}\n")
        if b is not None:
            sys.stderr.write(f"\n--- worker B ---\n{b.output()[-4000:]}\n")
        raise
    finally:
        a.stop()
        if b is not None:
            b.stop()
        conn.close()
        shutil.rmtree(tmp, ignore_errors=True)
