"""Workflows at scale: a 10,000-member chord against a plain drain,
and a 100-step chain's per-hop latency against a single job's.

    bench/run --workflows                      # 10,000 members, 3 alternated rounds, a 100-step chain
    bench/run --workflows --smoke              # tiny: 300 members, 1 round, a 10-step chain
    BENCH_HARNESS=../shared/bench scripts/dev python bench/workflows.py --work ../shared/bench

On a fresh database of the harness's server (``bench_workflows``, or
``$BENCH_WORKFLOWS_DB``; the bench adapter's settings, bench/peers/dj_pgjobs), with
two plain ``runjobs`` processes:

1. **Chord enqueue**: ``chord(group(noop.si() x N), noop.si()).enqueue()`` in one
   transaction: its statements counted (the writer's round trips) and timed.
2. **Drain**: N plain no-op jobs (``enqueue_many``) and the chord's N + 1 jobs,
   drained by the two workers, in alternating order per round. The rate is taken
   from the rows (jobs / (last ``finished_at`` - first ``started_at``)), so process
   start-up is not in it. Criterion: chord >= 0.8x plain.
3. **Latency**: ``--probes`` single no-op jobs enqueued one by one (enqueue ->
   start, from the rows: ``started_at - created_at``), then a ``--chain``-step
   chain: each hop is the child's ``started_at`` minus its parent's ``finished_at``
   (the parent's completion releases the child in its transaction; the NOTIFY
   wakes a worker at commit). Criterion: median hop <= 2x the median single job.

Figures on a shared box move with its load: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
# Its own database on the harness's server; BENCH_WORKFLOWS_DB names another, so two
# runs on one server (two engineers, two trees) do not drop each other's tables.
DB = os.environ.get("BENCH_WORKFLOWS_DB", "bench_workflows")

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument(
    "--work",
    default=os.environ.get("BENCH_HARNESS", str(HERE.parent.parent / "shared" / "bench")),
    help="the harness (its benchlib holds the no-op's body)",
)
parser.add_argument("--n", type=int, default=10_000, help="chord members, and plain jobs")
parser.add_argument(
    "--rounds", type=int, default=3, help="drain rounds (plain and chord alternate)"
)
parser.add_argument("--chain", type=int, default=100, help="steps of the chain")
parser.add_argument("--probes", type=int, default=100, help="single jobs for the latency baseline")
parser.add_argument(
    "--trigger-off",
    action="store_true",
    help="diagnosis: the chord drained with the workflow trigger disabled (its callback"
    " never runs: the members' rate alone)",
)
parser.add_argument("--workers", type=int, default=2, help="runjobs processes (the harness: 2)")
parser.add_argument(
    "--batch", type=int, default=None, help="diagnosis: runjobs --batch (default: runjobs' own)"
)
parser.add_argument(
    "--smoke", action="store_true", help="tiny: --n 300 --rounds 1 --chain 10 --probes 10"
)
A = parser.parse_args()
if A.smoke:
    A.n, A.rounds, A.chain, A.probes = 300, 1, 10, 10
if A.n < 1 or A.rounds < 1 or A.chain < 2 or A.probes < 1:
    raise SystemExit("workflows: --n, --rounds, --probes must be >= 1 and --chain >= 2")

os.environ.update(
    DJANGO_SETTINGS_MODULE="dj_pgjobs.settings", BENCH_DB=DB, PYTHONDONTWRITEBYTECODE="1"
)
sys.path[:0] = [str(PEERS), A.work]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(PEERS), A.work, os.environ.get("PYTHONPATH", "")]),
}

import psycopg  # noqa: E402


def server_dsn(db: str) -> str:
    host = os.environ.get("BENCH_PGHOST", "127.0.0.1")
    port = os.environ.get("BENCH_PGPORT", "5432")
    user = os.environ.get("BENCH_PGUSER", "postgres")
    return f"host={host} port={port} user={user} dbname={db}"


def fresh_database() -> None:
    with psycopg.connect(server_dsn("postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"], env=ENV, cwd=PEERS, check=True
    )


fresh_database()

import django  # noqa: E402

django.setup()

from dj_pgjobs.jobs import noop  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from django_pgjobs import chain, chord, group  # noqa: E402


def say(text: str) -> None:
    print(f"{text}  (load {os.getloadavg()[0]:.1f})", flush=True)


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def empty_tables() -> None:
    sql(
        "TRUNCATE django_pgjobs_job, django_pgjobs_jobstep, django_pgjobs_jobdependency, django_pgjobs_workflow,"
        " django_pgjobs_jobresult, django_pgjobs_jobsignal"
    )
    with psycopg.connect(server_dsn(DB), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE django_pgjobs_job")


def workers(n: int = A.workers) -> list[subprocess.Popen[bytes]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "runjobs", "--verbosity", "0"]
            + ([f"--batch={A.batch}"] if A.batch else []),
            env=ENV,
            cwd=PEERS,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    wait(lambda: sql("SELECT count(*) FROM django_pgjobs_worker")[0][0] >= n, "workers up")
    return procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=60)
    sql("DELETE FROM django_pgjobs_worker")


def wait(condition: Any, what: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"workflows: timed out waiting for {what}")
        time.sleep(0.05)


def all_done(total: int) -> bool:
    return sql("SELECT count(*) FROM django_pgjobs_job WHERE status = 'completed'")[0][0] >= total


def drain_rate(total: int) -> float:
    """Jobs per second from the rows: first start to last finish."""
    wait(lambda: all_done(total), f"{total} jobs completed")
    first, last = sql(
        "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at))"
        " FROM django_pgjobs_job"
    )[0]
    return total / max(float(last) - float(first), 1e-6)


def drain_plain() -> float:
    empty_tables()  # the trigger as --trigger-off left it: plain jobs never reach its step
    noop.enqueue_many([()] * A.n)
    procs = workers()
    try:
        return drain_rate(A.n)
    finally:
        stop(procs)


def drain_chord() -> tuple[float, int, float]:
    empty_tables()
    members = group(noop.si() for _ in range(A.n))
    with CaptureQueriesContext(connection) as queries:
        start = time.perf_counter()
        with transaction.atomic():
            chord(members, noop.si()).enqueue()
        enqueue_s = time.perf_counter() - start
    statements = sum(
        1
        for q in queries.captured_queries
        if "django_pgjobs" in q["sql"] and "SAVEPOINT" not in q["sql"]
    )
    if A.trigger_off:
        with psycopg.connect(server_dsn(DB), autocommit=True) as conn:
            conn.execute("ALTER TABLE django_pgjobs_job DISABLE TRIGGER pgjobs_workflow_step")
    procs = workers()
    try:
        rate = drain_rate(A.n if A.trigger_off else A.n + 1)
    finally:
        stop(procs)
    if not A.trigger_off:  # where the time went: the members, then the callback's wait
        first, last_member, cb_start, cb_end = sql(
            "WITH cb AS (SELECT max(id) AS id FROM django_pgjobs_job)"
            " SELECT extract(epoch FROM min(j.started_at)),"
            " extract(epoch FROM max(j.finished_at) FILTER (WHERE j.id <> cb.id)),"
            " extract(epoch FROM max(j.started_at) FILTER (WHERE j.id = cb.id)),"
            " extract(epoch FROM max(j.finished_at) FILTER (WHERE j.id = cb.id))"
            " FROM django_pgjobs_job j, cb"
        )[0]
        say(
            f"  members {float(last_member) - float(first):.3f} s, then the callback started"
            f" {float(cb_start) - float(last_member):.3f} s after the last member finished,"
            f" ran {float(cb_end) - float(cb_start):.3f} s"
        )
    return rate, statements, enqueue_s


def latencies() -> tuple[list[float], list[float], float]:
    empty_tables()
    with psycopg.connect(server_dsn(DB), autocommit=True) as conn:
        conn.execute("ALTER TABLE django_pgjobs_job ENABLE TRIGGER pgjobs_workflow_step")
    procs = workers()
    try:
        for _ in range(A.probes):
            noop.enqueue()
            time.sleep(0.05)
        wait(lambda: all_done(A.probes), "the single jobs")
        single = [
            float(r[0])
            for r in sql(
                "SELECT extract(epoch FROM started_at - created_at) FROM django_pgjobs_job"
            )
        ]
        run = chain(*[noop.si() for _ in range(A.chain)]).enqueue()
        wait(lambda: all_done(A.probes + A.chain), "the chain")
        rows = sql(
            "SELECT extract(epoch FROM created_at), extract(epoch FROM started_at),"
            " extract(epoch FROM finished_at) FROM django_pgjobs_job WHERE workflow_id = %s"
            " ORDER BY id",
            [run.id],
        )
        hops = [float(b[1]) - float(a[2]) for a, b in itertools.pairwise(rows)]
        whole = (float(rows[-1][2]) - float(rows[0][0])) / A.chain
        return single, hops, whole
    finally:
        stop(procs)


def ms(values: list[float]) -> str:
    q = statistics.quantiles(values, n=20) if len(values) > 1 else values * 19
    return f"median {statistics.median(values) * 1000:.1f} ms, p95 {q[18] * 1000:.1f} ms"


def main() -> None:
    say(
        f"workflows bench: N={A.n}, {A.rounds} round(s), a {A.chain}-step chain, {A.probes}"
        f" probes, {A.workers} runjobs processes" + (f" (--batch {A.batch})" if A.batch else "")
    )
    plain: list[float] = []
    chords: list[float] = []
    for round_ in range(A.rounds):
        order = ("plain", "chord") if round_ % 2 == 0 else ("chord", "plain")
        for kind in order:
            if kind == "plain":
                plain.append(drain_plain())
                say(f"round {round_ + 1} plain: {plain[-1]:,.0f} jobs/s")
            else:
                rate, statements, enqueue_s = drain_chord()
                chords.append(rate)
                say(
                    f"round {round_ + 1} chord: {rate:,.0f} jobs/s; enqueue of {A.n} members"
                    f" + callback: {statements} statements, {enqueue_s:.2f} s"
                )
    single, hops, whole = latencies()
    ratio = statistics.median(chords) / statistics.median(plain)
    hop_ratio = statistics.median(hops) / statistics.median(single)
    print()
    print("| measure | result |")
    print("|---|---|")
    print(
        f"| plain drain of {A.n} no-op jobs | {statistics.median(plain):,.0f} jobs/s (median of {len(plain)}: {', '.join(f'{r:,.0f}' for r in plain)}) |"
    )
    print(
        f"| chord of {A.n} members drained | {statistics.median(chords):,.0f} jobs/s (median of {len(chords)}: {', '.join(f'{r:,.0f}' for r in chords)}) |"
    )
    print(
        f"| chord / plain | {ratio:.2f} (criterion >= 0.8: {'met' if ratio >= 0.8 else 'NOT met'}) |"
    )
    print(f"| single job enqueue -> start | {ms(single)} |")
    print(f"| {A.chain}-step chain, parent finished -> child started | {ms(hops)} |")
    print(f"| chain end to end, per step (run and completion included) | {whole * 1000:.1f} ms |")
    print(
        f"| hop / single (medians) | {hop_ratio:.2f} (criterion <= 2: {'met' if hop_ratio <= 2 else 'NOT met'}) |"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (shared box: read the spread)")
    connection.close()
    with psycopg.connect(server_dsn("postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
