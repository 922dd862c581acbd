"""Failover drill on PostgreSQL's own streaming replication.

A primary and a streaming standby (initdb / pg_basebackup, free loopback ports);
workers and an enqueuing process connect with one multi-host URL
(``postgres://...@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write``,
which django-environ turns into HOST/PORT lists and OPTIONS for libpq). Mid-drain
the primary is stopped hard (``pg_ctl stop -m immediate``) and the standby promoted.

* synchronous replication: every enqueue the client saw commit is completed
  exactly once on the new primary (atomic jobs: exactly one effect row), and the
  workers carry on without a restart;
* asynchronous replication: the acknowledged-but-lost enqueues are counted and
  printed (the window documented in docs/howto/deploy-workers.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT, WorkerProcess, wait_until
from tests.faults.conftest import EFFECTS_DDL, django_env
from tests.helpers.cluster import TempCluster

pytestmark = pytest.mark.failover

DB = "failover"
#: libpq options for every drill connection: fail a connect attempt fast.
URL_OPTIONS = "target_session_attrs=read-write&connect_timeout=2"


@dataclass
class Pair:
    primary: TempCluster
    standby: TempCluster
    tmp: Path

    @property
    def url(self) -> str:
        return (
            f"postgres://postgres@127.0.0.1:{self.primary.port},127.0.0.1:"
            f"{self.standby.port}/{DB}?{URL_OPTIONS}"
        )

    def destroy(self) -> None:
        for cluster in (self.primary, self.standby):
            cluster.destroy()


def make_pair(tmp: Path, *, synchronous: bool) -> Pair:
    try:
        primary = TempCluster(
            name="fo-primary",
            conf={
                "max_connections": "100",
                "wal_level": "replica",
                "max_wal_senders": "5",
                "synchronous_commit": "on",
            },
        )
    except RuntimeError as exc:
        pytest.skip(f"failover drill needs PostgreSQL server binaries: {exc}")
    primary.start()
    standby: TempCluster | None = None
    try:
        primary.create_database(DB)
        url = primary.url(DB)
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v0"],
            cwd=ROOT,
            env=django_env(url),
            check=True,
        )
        with psycopg.connect(primary.dsn(DB), autocommit=True) as conn:
            conn.execute(EFFECTS_DDL)
        standby = primary.standby(name="standby", conf={"hot_standby": "on"})
        standby.start()
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            if synchronous:
                # Only now: a synchronous primary without its standby blocks every commit.
                # The standby's application name is its cluster_name.
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
                conn.execute("SELECT pg_reload_conf()")
            want = "sync" if synchronous else "async"
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
                        " AND state = 'streaming'"
                    ).fetchone()
                    == (want,)
                ),
                timeout=30,
                message=f"standby streaming ({want})",
            )
    except BaseException:
        primary.destroy()
        if standby is not None:
            standby.destroy()
        raise
    return Pair(primary, standby, tmp)


@pytest.fixture
def drill_dir() -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="pgjobs-failover-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_drill(
    pair: Pair, *, n_before: int = 150, enqueuers: int = 1, stall_standby: float = 0.0
) -> dict[str, object]:
    """Enqueue and drain, fail over mid-drain, then let everything settle."""
    tmp = pair.tmp
    stop = tmp / "stop"
    acks_files = [tmp / f"acks-{i}.txt" for i in range(enqueuers)]
    env = django_env(pair.url, PGJOBS_FAULT_SIGNAL_LOG=str(tmp / "signals.jsonl"))
    enq_log = open(tmp / "enqueuer.log", "wb")  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.faults.enqueuer", str(ack), str(stop)],
            cwd=ROOT,
            env={**env, "PGJOBS_DRILL_PREFIX": f"e{i}"},
            stdout=enq_log,
            stderr=subprocess.STDOUT,
        )
        for i, ack in enumerate(acks_files)
    ]
    lag_ms: list[float] = []
    workers = [
        WorkerProcess(["--concurrency", "4"], env, tmp / f"worker-{i}.log") for i in range(2)
    ]
    try:

        def acked() -> list[tuple[str, int, float]]:
            return [
                (a, int(b), float(c))
                for ack in acks_files
                if ack.exists()
                for a, b, c in (
                    line.split() for line in ack.read_text().splitlines() if len(line.split()) == 3
                )
            ]

        wait_until(lambda: len(acked()) >= n_before, timeout=60, message="enqueues before")
        with psycopg.connect(pair.primary.dsn(DB), autocommit=True) as conn:
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM django_pgjobs_job WHERE status = 'completed'"
                    ).fetchone()[0]
                    >= n_before // 3
                ),
                timeout=60,
                message="drain under way",
            )
            # How far the standby trails under this load (the loss window, when async).
            for _ in range(20):
                row = conn.execute(
                    "SELECT extract(epoch FROM write_lag) * 1000 FROM pg_stat_replication"
                ).fetchone()
                if row and row[0] is not None:
                    lag_ms.append(float(row[0]))
                time.sleep(0.02)
        stalled_at = None
        if stall_standby:
            # A standby that falls behind (a slow network or disk): stop the primary's
            # WAL sender; an asynchronous primary keeps acknowledging commits.
            with psycopg.connect(pair.primary.dsn(), autocommit=True) as pconn:
                sender = pconn.execute("SELECT pid FROM pg_stat_replication").fetchone()[0]
            os.kill(sender, signal.SIGSTOP)
            stalled_at = time.time()
            time.sleep(stall_standby)
            os.kill(sender, signal.SIGKILL)  # what it had not sent dies with the primary
        crash_at = time.time()
        with contextlib.suppress(subprocess.CalledProcessError):  # already down (the sender died)
            pair.primary.stop_immediate()
        pair.standby.promote()
        promoted_at = time.time()
        before = len(acked())
        wait_until(
            lambda: len(acked()) >= before + 50, timeout=60, message="enqueues after promotion"
        )
        stop.touch()
        for proc in procs:
            proc.wait(timeout=30)
        acks = acked()
        ids = {job_id for _, job_id, _ in acks}
        with psycopg.connect(pair.standby.dsn(DB), autocommit=True) as conn:

            def settled() -> bool:
                return (
                    conn.execute(
                        "SELECT count(*) FROM django_pgjobs_job WHERE status <> 'completed'"
                    ).fetchone()[0]
                    == 0
                )

            wait_until(settled, timeout=60, message="every job completed on the new primary")
            rows = dict(
                conn.execute("SELECT idempotency_key, id FROM django_pgjobs_job").fetchall()
            )
            atomic_effects = dict(
                conn.execute(
                    "SELECT j.id, count(e.id) FROM django_pgjobs_job j LEFT JOIN fault_effects e"
                    " ON e.job_id = j.id WHERE j.task LIKE '%%fault_atomic'"
                    " GROUP BY j.id"
                ).fetchall()
            )
            reruns = conn.execute(
                "SELECT count(*) FROM django_pgjobs_job WHERE attempts > 1"
            ).fetchone()[0]
            # Runs by two processes under one lease: a claim that committed
            # asynchronously was lost with the old primary, and its lease number
            # was handed out again on the new one.
            shared_leases = conn.execute(
                "SELECT count(*) FROM (SELECT job_id, lease FROM fault_effects"
                " GROUP BY job_id, lease HAVING count(DISTINCT pid) > 1) AS s"
            ).fetchone()[0]
        lost = [(key, job_id, at) for key, job_id, at in acks if rows.get(key) != job_id]
        for worker in workers:
            assert worker.proc.poll() is None, f"worker exited:\n{worker.output()[-3000:]}"
        return {
            "acked": len(acks),
            "lost": lost,
            "ids": ids,
            "rows": rows,
            "atomic_effects": atomic_effects,
            "crash_at": crash_at,
            "promoted_at": promoted_at,
            "reruns": reruns,
            "shared_leases": shared_leases,
            "max_lag_ms": max(lag_ms, default=0.0),
            "stalled_at": stalled_at,
        }
    finally:
        stop.touch()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        enq_log.close()
        for worker in workers:
            worker.stop()


def test_failover_synchronous_loses_no_acknowledged_job(drill_dir: Path) -> None:
    pair = make_pair(drill_dir, synchronous=True)
    try:
        result = run_drill(pair)
    finally:
        pair.destroy()
    print(
        f"\nsynchronous failover: {result['acked']} acknowledged enqueues, "
        f"{len(result['lost'])} lost, {result['reruns']} jobs ran more than once, "
        f"{result['shared_leases']} leases used by two processes"
    )
    assert result["lost"] == [], f"acknowledged but lost: {result['lost'][:10]}"
    # Atomic jobs: their effect row commits with the completion, so exactly one.
    effects = result["atomic_effects"]
    assert effects, "no atomic job ran"
    wrong = {j: n for j, n in effects.items() if n != 1}
    assert not wrong, f"atomic jobs whose effects are not exactly once: {wrong}"


def test_failover_asynchronous_measures_the_loss_window(drill_dir: Path) -> None:
    pair = make_pair(drill_dir, synchronous=False)
    try:
        result = run_drill(pair, n_before=300, enqueuers=4)
    finally:
        pair.destroy()
    lost = result["lost"]
    crash_at = float(result["crash_at"])  # type: ignore[arg-type]
    window = max((crash_at - at for _, _, at in lost), default=0.0)  # type: ignore[union-attr]
    line = (
        f"asynchronous failover: {result['acked']} acknowledged enqueues, {len(lost)} lost "
        f"(acknowledged at most {window * 1000:.0f} ms before the crash), "
        f"standby write lag under load up to {result['max_lag_ms']:.1f} ms, "
        f"{result['reruns']} jobs ran more than once"
    )
    print("\n" + line)
    report = os.environ.get("PGJOBS_FAILOVER_REPORT")
    if report:
        with open(report, "a") as fh:
            fh.write(line + "\n")
    # Whatever was lost was acknowledged just before the crash, never after promotion.
    promoted_at = float(result["promoted_at"])  # type: ignore[arg-type]
    assert all(at < promoted_at for _, _, at in lost), lost  # type: ignore[union-attr]
    effects = result["atomic_effects"]
    wrong = {j: n for j, n in effects.items() if n != 1}  # type: ignore[union-attr]
    assert not wrong, f"atomic jobs whose effects are not exactly once: {wrong}"


def test_failover_asynchronous_loses_what_the_standby_had_not_received(drill_dir: Path) -> None:
    """The window is the standby's lag at the crash: stall the primary's WAL sender for
    1 s and exactly the enqueues acknowledged during that second are lost."""
    pair = make_pair(drill_dir, synchronous=False)
    try:
        result = run_drill(pair, n_before=150, enqueuers=2, stall_standby=1.0)
    finally:
        pair.destroy()
    lost = result["lost"]
    stalled_at = float(result["stalled_at"])  # type: ignore[arg-type]
    crash_at = float(result["crash_at"])  # type: ignore[arg-type]
    line = (
        f"asynchronous failover, standby 1 s behind: {result['acked']} acknowledged, "
        f"{len(lost)} lost, all acknowledged in the "  # type: ignore[arg-type]
        f"{(crash_at - stalled_at) * 1000:.0f} ms between the stall and the crash"
    )
    print("\n" + line)
    report = os.environ.get("PGJOBS_FAILOVER_REPORT")
    if report:
        with open(report, "a") as fh:
            fh.write(line + "\n")
    assert lost, "a standby 1 s behind lost nothing: the drill did not measure the window"
    # 50 ms of slack: WAL already in flight when the receiver stopped.
    assert all(at >= stalled_at - 0.05 for _, _, at in lost), (stalled_at, lost[:5])  # type: ignore[union-attr]
