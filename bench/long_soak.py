"""A soak that stands for weeks: JOBS jobs at RATE/s through one PostgreSQL.

``bench/run --long-soak`` starts a throwaway cluster (autovacuum on, the server's
default settings; ``--server shared`` uses ``BENCH_PGHOST``/``BENCH_PGPORT``
instead), migrates a fresh database, and runs 2 plain ``runjobs`` workers with
pruning on: completed jobs are kept ``--retention`` s and every worker's pruner
passes every ``--pruner-interval`` s, so the table should stay the size of a few
retentions however long the run. Jobs are offered in batches every 10 ms
(``noop.enqueue_many``); every ``--probe-every``-th job carries its enqueue time
and its handler records its start.

Every ``--report-every`` s one row: jobs finished in the interval (per second),
p50/p95/max enqueue->start of the probes that started in it, unfinished jobs,
the jobs tables' total size (heap + indexes + TOAST), their live and dead
tuples, rows pruned so far, each worker's RSS. Rows go to the console as they
come and to ``<work>/out/long-soak-<stamp>.jsonl``; the table to
``long-soak-<stamp>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import exit_on_sigterm, rss_kb, say  # noqa: E402
from cluster import Cluster  # noqa: E402
from trial_windows import pct  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument("--work", required=True, help="the writable harness copy (bench/run sets it)")
ap.add_argument("--jobs", type=int, default=10_000_000, help="jobs to offer in all")
ap.add_argument("--rate", type=float, default=2000.0, help="jobs offered per second")
ap.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: jobs/rate)")
ap.add_argument("--retention", type=float, default=60.0, help="seconds completed jobs are kept")
ap.add_argument("--pruner-interval", type=float, default=10.0, help="PGJOBS PRUNER_INTERVAL")
ap.add_argument("--probe-every", type=int, default=10, help="every n-th job measures latency")
ap.add_argument("--report-every", type=float, default=60.0, help="seconds per reported row")
ap.add_argument("--server", choices=["own", "shared"], default="own")
ap.add_argument("--drain-timeout", type=float, default=120.0)
A = ap.parse_args()
for name, value in (
    ("--jobs", A.jobs),
    ("--rate", A.rate),
    ("--retention", A.retention),
    ("--pruner-interval", A.pruner_interval),
    ("--probe-every", A.probe_every),
    ("--report-every", A.report_every),
):
    if not value > 0:
        raise SystemExit(f"long soak: {name} must be > 0, got {value}")
if A.minutes < 0:
    raise SystemExit(f"long soak: --minutes must be >= 0, got {A.minutes}")

WORK = os.path.abspath(A.work)
OUT = os.path.join(WORK, "out")
DB = "bench_long_soak"
STEP = 0.01  # seconds between enqueue batches
SIZE = (
    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c"
    " WHERE c.relkind = 'r' AND c.relname LIKE 'django_pgjobs_%'"
)
TUPLES = (
    "SELECT coalesce(sum(n_live_tup), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint,"
    " coalesce(sum(n_tup_del), 0)::bigint, coalesce(sum(autovacuum_count), 0)::bigint"
    " FROM pg_stat_user_tables WHERE relname LIKE 'django_pgjobs_%'"
)
UNFINISHED = "SELECT count(*) FROM django_pgjobs_job WHERE status IN ('pending', 'running')"


class Probes:
    """Reads the workers' ``ts start`` lines as they are appended."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self.all: list[float] = []

    def new(self) -> list[float]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # whole lines only: a worker may be mid-write
        self.offset += end
        lats = [
            (float(b) - float(a)) * 1000
            for a, b in (line.split() for line in chunk[:end].decode().splitlines())
            if float(a) > 0
        ]
        self.all.extend(lats)
        return sorted(lats)


def row(
    conn: Any, procs: list[Any], probes: Probes, sent: int, t0: float, last: dict[str, float]
) -> dict[str, Any]:
    now = time.time()
    unfinished = conn.execute(UNFINISHED).fetchone()[0]
    size = conn.execute(SIZE).fetchone()[0]
    live, dead, deleted, vacuums = conn.execute(TUPLES).fetchone()
    done = sent - unfinished
    lats = probes.new()
    r = {
        "t_s": round(now - t0, 1),
        "sent": sent,
        "done": done,
        "offered_per_s": round((sent - last["sent"]) / max(1e-3, now - last["t"]), 1),
        "jobs_per_s": round((done - last["done"]) / max(1e-3, now - last["t"]), 1),
        "probes": len(lats),
        "p50_ms": round(pct(lats, 0.5), 2) if lats else None,
        "p95_ms": round(pct(lats, 0.95), 2) if lats else None,
        "max_ms": round(lats[-1], 2) if lats else None,
        "unfinished": unfinished,
        "tables_mib": round(size / 2**20, 1),
        "live": live,
        "dead": dead,
        "pruned": deleted,
        "autovacuums": vacuums,
        "rss_mib": [round(rss_kb(p.pid) / 1024, 1) for p in procs],
    }
    last.update(sent=sent, done=done, t=now)
    return r


HEADER = (
    "| t s | sent | jobs/s offered | jobs/s finished | p50 ms | p95 ms | max ms | unfinished | tables MiB "
    "| live | dead | pruned | autovacuums | worker RSS MiB |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def md_row(r: dict[str, Any]) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    return (
        f"| {r['t_s']:g} | {r['sent']:,} | {r['offered_per_s']:,.0f} | {r['jobs_per_s']:,.0f} | {f(r['p50_ms'])} "
        f"| {f(r['p95_ms'])} | {f(r['max_ms'])} | {r['unfinished']:,} | {r['tables_mib']:,.1f} "
        f"| {r['live']:,} | {r['dead']:,} | {r['pruned']:,} | {r['autovacuums']} "
        f"| {', '.join(f'{m:.0f}' for m in r['rss_mib'])} |"
    )


def soak(port: str, stamp: str) -> tuple[list[dict[str, Any]], list[float]]:
    """The run itself; the rows reported and every probe's latency (ms)."""
    os.environ.update(
        BENCH_PGPORT=port,
        BENCH_PGJOBS_RETENTION=repr(A.retention),
        BENCH_PGJOBS_PRUNER_INTERVAL=repr(A.pruner_interval),
    )
    os.chdir(WORK)
    sys.path[:0] = [os.path.join(WORK, "peers"), WORK]
    import benchlib
    import peer_django_pgjobs as ours
    import psycopg

    with psycopg.connect(benchlib.dsn_for("postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    adapter = ours.Adapter(DB)
    adapter.setup()
    lat_file = os.path.join(OUT, f"long-soak-{stamp}-started.txt")
    open(lat_file, "w").close()
    probes = Probes(lat_file)
    procs = benchlib.start_workers(adapter, "long-soak", {benchlib.LATENCY_FILE_ENV: lat_file})
    conn = psycopg.connect(adapter.dsn, autocommit=True)
    rows: list[dict[str, Any]] = []
    secs = A.minutes * 60 if A.minutes else A.jobs / A.rate

    def report(r: dict[str, Any]) -> None:
        rows.append(r)
        with open(os.path.join(OUT, f"long-soak-{stamp}.jsonl"), "a") as jsonl:
            jsonl.write(json.dumps(r) + "\n")
        print(md_row(r), flush=True)

    try:
        time.sleep(3)  # the workers' start-up is not the soak's
        print(HEADER, flush=True)
        t0 = time.time()
        last = {"sent": 0.0, "done": 0.0, "t": t0}
        report(row(conn, procs, probes, 0, t0, last))
        sent, carry, i = 0, 0.0, 0
        t_report = t0 + A.report_every
        while sent < A.jobs and time.time() - t0 < secs:  # bounded by count and time
            due = t0 + i * STEP
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            i += 1
            carry += A.rate * STEP
            k = min(int(carry), A.jobs - sent)
            carry -= k
            if k:
                now = time.time()
                calls = [(now,) if (sent + j) % A.probe_every == 0 else () for j in range(k)]
                adapter.noop.enqueue_many(calls)
                sent += k
            if time.time() >= t_report:
                benchlib.check_alive(procs)
                report(row(conn, procs, probes, sent, t0, last))
                t_report += A.report_every
        deadline = time.time() + A.drain_timeout
        while conn.execute(UNFINISHED).fetchone()[0] and time.time() < deadline:
            time.sleep(0.5)
        report(row(conn, procs, probes, sent, t0, last))
    finally:
        conn.close()
        adapter.close()
        benchlib.stop_workers(procs)
    return rows, probes.all


def main() -> None:
    exit_on_sigterm()
    os.makedirs(OUT, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    secs = A.minutes * 60 if A.minutes else A.jobs / A.rate
    say(
        f"long soak: up to {A.jobs:,} jobs at {A.rate:,.0f}/s for up to {secs / 60:.1f} min;"
        f" retention {A.retention:g} s, pruner every {A.pruner_interval:g} s"
    )
    if A.server == "own":
        with Cluster(name="soak") as cluster:
            # where to point bench/admin_pages.py (attach, measure) while it runs
            say(f"cluster on 127.0.0.1:{cluster.port}, database {DB}")
            try:
                rows, lats = soak(str(cluster.port), stamp)
            finally:
                cluster.save_log(os.path.join(OUT, f"long-soak-{stamp}-server.log"))
    else:
        rows, lats = soak(os.environ.get("BENCH_PGPORT", "5432"), stamp)
    end = rows[-1]
    lats.sort()
    sizes = [r["tables_mib"] for r in rows]
    text = "\n".join(
        [
            f"## Long soak {stamp}",
            "",
            f"{end['sent']:,} jobs offered in {end['t_s']:,.0f} s "
            f"({end['sent'] / max(end['t_s'], 1e-3):,.0f}/s; asked {A.rate:,.0f}/s), "
            f"{end['done']:,} finished; "
            f"retention {A.retention:g} s, pruner every {A.pruner_interval:g} s; "
            f"{A.server} server; 2 plain runjobs workers; 1 in {A.probe_every} jobs probed.",
            "",
            HEADER,
            *(md_row(r) for r in rows),
            "",
            f"all {len(lats):,} probes: p50 {pct(lats, 0.5):.1f}, p95 {pct(lats, 0.95):.1f}, "
            f"max {lats[-1] if lats else float('nan'):.1f} ms; "
            f"tables: {sizes[0]:,.1f} MiB at the start, at most {max(sizes):,.1f} MiB, "
            f"{sizes[-1]:,.1f} MiB at the end; worker RSS {rows[0]['rss_mib']} -> "
            f"{end['rss_mib']} MiB",
        ]
    )
    with open(os.path.join(OUT, f"long-soak-{stamp}.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text, flush=True)
    if end["done"] != end["sent"]:
        raise SystemExit(f"long soak: {end['sent'] - end['done']:,} jobs never finished")


if __name__ == "__main__":
    main()
