"""The project's own performance measurements, run by ``bench/run``.

1-4  side by side with the peers: the shared harness's ``driver.py`` runs our adapter
     (``peers/peer_django_pgjobs.py``) and each peer the same way; ratios are taken
     within this one run. Latency is also measured with ``--no-listen``.
5    flat with history and backlog: drain with HISTORY finished rows in the table vs an
     empty table (and the claim's EXPLAIN plan on that table); drain of a 100,000-job
     backlog vs the 20,000-job rate.
6    sustained load: a soak at RATE jobs/s: latency p50/p95, dead tuples, worker RSS.
7    contention: catalog checks (no FK on the jobs table, none from results to jobs)
     and pg_stat_activity wait events sampled every 10 ms during a drain.

Prints one table; ``--smoke`` runs everything tiny and asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument("--work", required=True, help="the writable harness copy (bench/run sets it)")
ap.add_argument("--smoke", action="store_true", help="tiny sizes, our adapter only, no asserts")
ap.add_argument("--peers", default="pgqueuer", help="peers beside ours: comma list, 'all' or ''")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--n", type=int, default=20000)
ap.add_argument("--history", type=int, default=1_000_000, help="finished rows for target 5")
ap.add_argument("--backlog", type=int, default=100_000)
ap.add_argument("--soak-secs", type=float, default=60.0, help="target 6 (the issue asks 600)")
ap.add_argument("--soak-rate", type=float, default=2000.0)
ap.add_argument(
    "--no-poll-interval",
    type=float,
    default=0.2,
    help="poll interval of the --no-listen latency run",
)
ap.add_argument(
    "--modes",
    default="enqueue,drain,latency,io",
    help="driver modes of the side-by-side step (io: 2,000 x 50 ms jobs, sync and async)",
)
ap.add_argument(
    "--backlog-poll",
    type=float,
    default=1.0,
    help="target 5's backlog drains: seconds between counts of the completed jobs"
    " (the harness's 0.1 s count costs more the larger the drain)",
)
ap.add_argument(
    "--skip", default="", help="comma list of: side,nolisten,history,backlog,soak,contention"
)
A = ap.parse_args()

WORK = os.path.abspath(A.work)
sys.path[:0] = [os.path.join(WORK, "peers"), WORK]
os.chdir(WORK)
import benchlib  # noqa: E402
import peer_django_pgjobs as ours  # noqa: E402
from benchutil import rss_kb, say  # noqa: E402  (bench/, this script's folder)

SKIP = set(filter(None, A.skip.split(",")))
if A.smoke:
    A.n, A.reps, A.history, A.backlog, A.soak_secs, A.soak_rate = 500, 1, 20_000, 1000, 5, 200
    A.peers = ""
ROWS: list[tuple[str, str, str]] = []  # (target, measurement, value)


def row(target: str, what: str, value: str) -> None:
    ROWS.append((target, what, value))
    say(f"{target:3s} {what}: {value}")


def recreate(db: str) -> None:
    conn = ["-h", benchlib.PGHOST, "-p", benchlib.PGPORT, "-U", benchlib.PGUSER]
    subprocess.run(["dropdb", *conn, "--if-exists", "--force", db], check=True, capture_output=True)
    subprocess.run(["createdb", *conn, db], check=True, capture_output=True)


def med(vals: list[float]) -> float:
    return statistics.median(vals) if vals else float("nan")


# ---------------------------------------------------------------- 1-4 side by side
def side_by_side() -> dict[str, dict[str, float]]:
    peers = [
        "django_pgjobs",
        *(
            [p for p in A.peers.split(",") if p]
            if A.peers != "all"
            else ["procrastinate", "pgqueuer", "django_tasks_db", "django_q2", "chancy"]
        ),
    ]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args = [
        sys.executable,
        "driver.py",
        "--peers",
        ",".join(dict.fromkeys(peers)),
        "--reps",
        str(A.reps),
        "--n",
        str(A.n),
        "--stamp",
        stamp,
        "--modes",
        A.modes,
    ]
    if A.smoke:
        args += ["--n-single", "50", "--lat-n", "20", "--io-n", "200"]
    subprocess.run(args, check=True)
    with open(os.path.join(WORK, "out", f"results-{stamp}.json")) as results:
        runs = json.load(results)
    with open(os.path.join(WORK, "out", f"results-{stamp}.md")) as report:
        md = report.read().split("\n\n```json")[0]
    got: dict[str, dict[str, float]] = {}
    for name in peers:
        mine = [r for r in runs if r["peer"] == name and "error" not in r]
        errors = [r["error"] for r in runs if r["peer"] == name and "error" in r]
        if errors:
            raise SystemExit(f"{name}: {errors}")

        def pick(mode: str, key: str, mine: list[dict[str, Any]] = mine) -> float:
            return med([r[key] for r in mine if r["mode"] == mode and key in r])

        for kind in ("sync", "async"):
            io = [r for r in mine if r["mode"] == f"io-{kind}" and not r.get("not_applicable")]
            if io:
                wall = med([r["wall_s"] for r in io])
                ratio = med([r["wall_over_ideal"] for r in io if r.get("wall_over_ideal")])
                row(
                    "io",
                    f"{name} io-{kind} wall (ideal ratio)",
                    f"{wall:.2f} s ({ratio:.2f}x ideal)"
                    if ratio == ratio
                    else f"{wall:.2f} s (no ideal: unbounded)",
                )
        got[name] = {
            "bulk": pick("enqueue", "jobs_per_s"),
            "single": pick("enqueue", "single_jobs_per_s"),
            "drain": pick("drain", "jobs_per_s"),
            "p50": pick("latency", "p50_ms"),
            "p95": pick("latency", "p95_ms"),
            "foreign": max((r.get("foreign_cores") or 0) for r in mine),
        }
    print("\n" + md + "\n")
    us = got["django_pgjobs"]
    row("-", "foreign load (max cores, ours)", f"{us['foreign']}")
    ref = got.get("pgqueuer")
    if ref:
        row(
            "1",
            "drain vs pgqueuer",
            f"{us['drain']:,.0f} / {ref['drain']:,.0f} = {us['drain'] / ref['drain']:.2f}x (>= 1.0)",
        )
        row(
            "2",
            "bulk enqueue vs pgqueuer",
            f"{us['bulk']:,.0f} / {ref['bulk']:,.0f} = {us['bulk'] / ref['bulk']:.2f}x (>= 2.0)",
        )
        row(
            "3",
            "single enqueue vs pgqueuer",
            f"{us['single']:,.0f} / {ref['single']:,.0f} = {us['single'] / ref['single']:.2f}x (>= 1.0)",
        )
        row(
            "4",
            "latency p50 vs pgqueuer",
            f"{us['p50']:.2f} / {ref['p50']:.2f} ms = {us['p50'] / ref['p50']:.2f}x (<= 0.75)",
        )
    else:
        row(
            "1-3",
            "drain / bulk / single jobs/s",
            f"{us['drain']:,.0f} / {us['bulk']:,.0f} / {us['single']:,.0f}",
        )
    row("4", "latency p95 (LISTEN)", f"{us['p95']:.2f} ms (<= 10)")
    return got


def adapter_run(
    mode: str, n: int, env: dict[str, str], extra: list[str] | None = None
) -> dict[str, Any]:
    db = "bench_django_pgjobs"
    recreate(db)
    cmd = [
        sys.executable,
        os.path.join("peers", "peer_django_pgjobs.py"),
        mode,
        "--db",
        db,
        "--n",
        str(n),
        *(extra or []),
    ]
    out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"{cmd} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def no_listen() -> None:
    poll = A.no_poll_interval
    r = adapter_run(
        "latency",
        20 if A.smoke else 200,
        {"BENCH_PGJOBS_LISTEN": "0", "BENCH_PGJOBS_POLL": str(poll)},
    )
    row(
        "4",
        f"latency --no-listen, poll {poll}s: p50 / p95",
        f"{r['p50_ms']:.1f} / {r['p95_ms']:.1f} ms (p95 <= {poll * 1000 + 10:.0f})",
    )


# ---------------------------------------------------------------- 5 history and backlog
# One drain a side swung from 13,000 to 25,000 jobs/s on the 2-core box (docs: "History
# and backlog, three runs"), so each comparison is --reps alternated pairs (empty,
# history, empty, history ...; 20,000, backlog, ...) and their medians: drift of the
# box hits both sides alike. The history side keeps one database for every rep (its
# rows are inserted and VACUUM ANALYZEd once; each rep deletes the jobs it drained).
class HistoryAdapter(ours.Adapter):
    """Our adapter with HISTORY finished jobs in its database before the drain."""

    history = 0
    #: per database: the last id of its history (the drained jobs come after it)
    first_ids: dict[str, int] = {}

    def setup(self) -> None:
        from django.db import connection

        use_database(self.db)
        first = self.first_ids.get(self.db)
        with connection.cursor() as cur:
            if first is None:
                super().setup()
                cur.execute(
                    "INSERT INTO django_pgjobs_job (task, status, run_at, created_at,"
                    " started_at, finished_at, attempts, lease)"
                    " SELECT 'bench.history', 'completed', t, t, t, t, 1, 1"
                    " FROM (SELECT now() - make_interval(secs => g / 100.0) AS t"
                    "       FROM generate_series(1, %s) g) s",
                    [self.history],
                )
                cur.execute("SELECT coalesce(max(id), 0) FROM django_pgjobs_job")
                first = self.first_ids[self.db] = cur.fetchone()[0]
            else:  # a later rep: the previous rep's drained jobs go
                cur.execute("DELETE FROM django_pgjobs_job WHERE id > %s", [first])
            cur.execute("VACUUM ANALYZE django_pgjobs_job")
        # An installation with this history has counted it into its minute rollup as it
        # finished; a history inserted at once has not, and every worker's rollup pass
        # would spend its second per pass catching up on a day of it during the drain.
        from django_pgjobs.maintenance.rollup import Rollup

        Rollup(time_budget=None).run_once()
        with connection.cursor() as cur:
            # The insert (10 M rows: gigabytes of dirty pages) would be written out by
            # the checkpointer during the first drains, on the same disk: write it now.
            cur.execute("CHECKPOINT")
        self.first_id = first

    first_id = 0

    # Count only the drained jobs, through the (status, id) index: a count over the
    # history every 0.1 s would load the server and skew the rate being measured.
    def count_done(self, cur) -> int:
        cur.execute(
            "SELECT count(*) FROM django_pgjobs_job WHERE status = 'completed' AND id > %s",
            [self.first_id],
        )
        return cur.fetchone()[0]

    def finish_window(self, cur):
        cur.execute(
            "SELECT extract(epoch FROM min(finished_at))::float8,"
            " extract(epoch FROM max(finished_at))::float8 FROM django_pgjobs_job"
            " WHERE status = 'completed' AND id > %s",
            [self.first_id],
        )
        return cur.fetchone()


def use_database(db: str) -> None:
    """Point this process's Django connection (set up once, for the first database)
    and the workers it starts (``BENCH_DB``) at ``db``."""
    from django.db import connections

    os.environ["BENCH_DB"] = db
    connections.close_all()
    connections["default"].settings_dict["NAME"] = db


def claim_plan() -> str:
    from django.db import connection

    from django_pgjobs import claim

    with connection.cursor() as cur:
        cur.execute(
            "EXPLAIN (FORMAT JSON) " + claim.claim_statements()["JOB_CLAIM_ONE_QUEUE"],
            {"worker": "explain", "n": 100, "queue": "default", "since": claim.UNBOUNDED},
        )
        plan = cur.fetchone()[0]
    text = json.dumps(plan)
    return "claim index" if "pgjobs_job_claim_idx" in text else "NOT the claim index: " + text[:300]


def _pairs(a: list[float], b: list[float]) -> str:
    """The medians, their ratio and each rep's ratio."""
    ratios = ", ".join(f"{y / x:.2f}" for x, y in zip(a, b, strict=True))
    return f"{med(a):,.0f} vs {med(b):,.0f} jobs/s = {med(b) / med(a):.2f}x (reps: {ratios})"


def backlog_drain(n: int) -> float:
    """One drain of ``n`` jobs in a new database, polled for its end every
    ``--backlog-poll`` seconds (the harness polls every 0.1 s with a count of the
    completed jobs, whose cost grows with the drain)."""
    db = "bench_backlog"
    recreate(db)
    HistoryAdapter.first_ids.pop(db, None)
    HistoryAdapter.history = 0
    try:
        res = benchlib.mode_drain(HistoryAdapter(db), n, 900.0, poll=A.backlog_poll)
    finally:
        use_database("bench_django_pgjobs")
    return float(res["jobs_per_s"])


def history_and_backlog() -> None:
    n = A.n
    sides = (
        ("bench_hist_empty", 0),
        ("bench_hist_full", A.history),
    )
    for db, _ in sides:
        recreate(db)
    rates: dict[str, list[float]] = {db: [] for db, _ in sides}
    try:
        for rep in range(A.reps):
            for db, hist in sides:
                HistoryAdapter.history = hist
                adapter = HistoryAdapter(db)
                res = benchlib.mode_drain(adapter, n, 600.0)
                rates[db].append(res["jobs_per_s"])
                say(f"5 rep {rep + 1}: {db} {res['jobs_per_s']:,.0f} jobs/s")
                if hist and rep == 0:
                    row("5", "claim plan with history", claim_plan())
    finally:
        use_database("bench_django_pgjobs")  # the other targets' database
    row(
        "5",
        f"drain, empty vs {A.history:,} finished rows, medians of {A.reps} alternated",
        _pairs(*rates.values()) + " (>= 0.95)",
    )
    if "backlog" in SKIP:
        return
    r20: list[float] = []
    r100: list[float] = []
    for rep in range(A.reps):
        r20.append(backlog_drain(n))
        r100.append(backlog_drain(A.backlog))
        say(f"5 rep {rep + 1}: backlog {n:,} {r20[-1]:,.0f}, {A.backlog:,} {r100[-1]:,.0f} jobs/s")
    row(
        "5",
        f"drain, backlog {n:,} vs {A.backlog:,}, medians of {A.reps} alternated",
        _pairs(r20, r100) + " (>= 0.95)",
    )


# ---------------------------------------------------------------- 6 soak
def soak() -> None:
    import psycopg

    db = "bench_django_pgjobs"
    recreate(db)
    adapter = ours.Adapter(db)
    adapter.setup()
    lat_file = os.path.join(WORK, "out", "soak-latency.txt")
    os.makedirs(os.path.dirname(lat_file), exist_ok=True)
    open(lat_file, "w").close()
    procs = benchlib.start_workers(adapter, "soak", {benchlib.LATENCY_FILE_ENV: lat_file})
    conn = psycopg.connect(adapter.dsn, autocommit=True)
    dead_max = 0
    try:
        time.sleep(3)
        rss0 = [rss_kb(p.pid) for p in procs]
        step = 0.01
        per_step = A.soak_rate * step
        t0 = time.perf_counter()
        t_next, sent, carry, t_sample = t0, 0, 0.0, t0
        while time.perf_counter() - t0 < A.soak_secs:
            delay = t_next - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            carry += per_step
            k = int(carry)
            carry -= k
            if k:
                now = time.time()
                adapter.noop.enqueue_many([(now,)] * k)
                sent += k
            t_next += step
            if time.perf_counter() - t_sample > 5:
                t_sample = time.perf_counter()
                benchlib.check_alive(procs)
                dead_max = max(
                    dead_max,
                    conn.execute(
                        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname='django_pgjobs_job'"
                    ).fetchone()[0],
                )
        elapsed = time.perf_counter() - t0
        deadline = time.time() + 30
        while adapter.count_done(conn.cursor()) < sent and time.time() < deadline:
            time.sleep(0.2)
        rss1 = [rss_kb(p.pid) for p in procs]
    finally:
        adapter.close()
        benchlib.stop_workers(procs)
    lats = sorted(
        (float(b) - float(a)) * 1000
        for a, b in (
            line.split() for line in Path(lat_file).read_text().splitlines() if line.strip()
        )
    )
    row(
        "6",
        f"soak {A.soak_secs:.0f}s at {A.soak_rate:,.0f} jobs/s",
        f"sent {sent:,} ({sent / elapsed:,.0f}/s), ran {len(lats):,}; latency p50 "
        f"{benchlib._pct(lats, 0.5):.1f} p95 {benchlib._pct(lats, 0.95):.1f} max {lats[-1] if lats else 0:.1f} ms (p95 < 20)",
    )
    row(
        "6",
        "soak: dead tuples (max sampled) / worker RSS start -> end",
        f"{dead_max:,} / "
        + ", ".join(
            f"{a / 1024:.0f} -> {b / 1024:.0f} MiB" for a, b in zip(rss0, rss1, strict=True)
        ),
    )
    conn.close()


# ---------------------------------------------------------------- 7 contention
def contention() -> None:
    import psycopg

    db = "bench_django_pgjobs"
    recreate(db)
    adapter = ours.Adapter(db)
    adapter.setup()
    with psycopg.connect(adapter.dsn, autocommit=True) as conn:
        fks = conn.execute(
            "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint"
            " WHERE contype = 'f' AND (conrelid = 'django_pgjobs_job'::regclass"
            " OR confrelid = 'django_pgjobs_job'::regclass"
            " OR conrelid = 'django_pgjobs_jobresult'::regclass)"
        ).fetchall()
    row("7", "foreign keys on/to the jobs table, from the result table", str(fks or "none"))
    waits: Counter[str] = Counter()
    samples = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal samples
        with psycopg.connect(adapter.dsn, autocommit=True) as c:
            while not stop.is_set():
                for (ev,) in c.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU')"
                    " FROM pg_stat_activity WHERE datname = %s AND state = 'active'"
                    " AND pid <> pg_backend_pid()",
                    [db],
                ).fetchall():
                    waits[ev] += 1
                samples += 1
                time.sleep(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    # Drain with the sampler running (the drain mode recreates nothing: same DB).
    adapter.prefill(A.n)
    adapter.close()
    procs = benchlib.start_workers(adapter, "contention")
    thread.start()
    try:
        with psycopg.connect(adapter.dsn, autocommit=True) as c:
            deadline = time.time() + 300
            while adapter.count_done(c.cursor()) < A.n and time.time() < deadline:
                benchlib.check_alive(procs)
                time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
        benchlib.stop_workers(procs)
    total = sum(waits.values()) or 1
    top = ", ".join(f"{k} {v / total * 100:.0f}%" for k, v in waits.most_common(6))
    row("7", f"wait events of active backends during a drain ({samples} samples)", top or "none")
    lock_waits = sum(v for k, v in waits.items() if k.startswith("Lock:"))
    row("7", "samples waiting on a heavyweight lock (Lock:*)", f"{lock_waits / total * 100:.1f}%")


def main() -> None:
    t0 = time.time()
    say(f"work dir {WORK}; smoke={A.smoke}; n={A.n} reps={A.reps}")
    steps = [
        ("side", side_by_side),
        ("nolisten", no_listen),
        ("history", history_and_backlog),
        ("contention", contention),
        ("soak", soak),
    ]
    for name, fn in steps:
        if name not in SKIP:
            say(f"== {name}")
            fn()
    print("\n| target | measurement | value |\n|---|---|---|")
    for t, what, value in ROWS:
        print(f"| {t} | {what} | {value} |")
    print(f"\nmachine: {os.cpu_count()} cores; total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
