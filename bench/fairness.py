"""Fair shares measured: a large tenant's backlog against small tenants' jobs, and the
fair claim's plan on a large table.

    DATABASE_URL=postgres://... scripts/dev python bench/fairness.py drain [--backlog 100000]
    DATABASE_URL=postgres://... scripts/dev python bench/fairness.py weights [--secs 60]
    DATABASE_URL=postgres://... scripts/dev python bench/fairness.py plain --other DIR
    DATABASE_URL=postgres://... scripts/dev python bench/fairness.py explain [--rows 1000000]

``drain``: tenant A enqueues --backlog jobs (one COPY), two plain ``runjobs`` start,
and once --warm of A's jobs have completed, tenants B..K enqueue --small jobs each
(one by one, in autocommit). Prints the start delay of the small tenants' jobs
(``started_at - created_at``: the database's clock on both sides) at p50/p99/max,
and A's drain rate (jobs completed per second from A's first start to its last
finish). Run once with the fair task (``tests.fair_jobs.tenant_job``, a fair key per
tenant) and once with the same task without a fair key (``unfair_tenant_job``, the
FIFO baseline), alternating --reps times; the ratio of A's rates is taken within a rep.

``weights``: tenants A and B each enqueue --backlog jobs, the queue row gives A the
weight 3, two plain ``runjobs`` drain for --secs seconds; prints the jobs of each
tenant started in that window and their ratio (3 wanted).

``plain``: --backlog no-op jobs without fair keys drained by two plain ``runjobs`` of
this checkout and of --other (a checkout of another commit: its ``runjobs`` runs with
that code on this database), alternating --reps times; prints each drain's rate.

``explain``: --rows pending jobs over --keys fair keys in one queue, VACUUM ANALYZE,
then ``EXPLAIN (ANALYZE, BUFFERS)`` of the fair claim of 10 jobs from a cursor in the
middle of the keys (the UPDATE rolled back), --reps times; beside it the plain claim
of the same table, and what walking every key would cost per claim (the alternative
the fair claim does not take).

It needs a migrated database and TRUNCATEs the jobs table there: never point it at a
database whose jobs you want to keep.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ["PGJOBS_TEST_FAIR"] = "1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import django  # noqa: E402

django.setup()

from django.db import connection, transaction  # noqa: E402

from bench.benchutil import exit_on_sigterm, say  # noqa: E402
from django_pgjobs.claim import claim_statements  # noqa: E402
from django_pgjobs.claim.fair import JOB_CLAIM_FAIR  # noqa: E402
from django_pgjobs.claim.plain import UNBOUNDED  # noqa: E402
from django_pgjobs.db.tables import JOB  # noqa: E402
from tests import fair_jobs  # noqa: E402

SMALL_TENANTS = "bcdefghijk"


def reset() -> None:
    with connection.cursor() as cur:
        cur.execute(
            f"TRUNCATE {JOB}, django_pgjobs_jobresult, django_pgjobs_queue, django_pgjobs_worker"
        )
        cur.execute(f"VACUUM ANALYZE {JOB}")


def start_workers(queue: str, count: int, root: Path = ROOT) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return [
        subprocess.Popen(
            [sys.executable, "-m", "django", "runjobs", "--queues", queue],
            env=env,
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for w in workers:
        w.terminate()
    for w in workers:
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.kill()


def check_alive(workers: list[subprocess.Popen[bytes]]) -> None:
    if any(w.poll() is not None for w in workers):
        raise RuntimeError("a worker exited (is the database migrated?)")


def completed(task: str, tenant: str | None = None) -> int:
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT count(*) FROM {JOB} WHERE task = %s AND status = 'completed'"
            " AND (%s::text IS NULL OR args ->> 0 = %s)",
            [task, tenant, tenant],
        )
        return int(cur.fetchone()[0])


def one_drain(fair: bool, args: argparse.Namespace) -> dict[str, float]:
    func: Any = fair_jobs.tenant_job if fair else fair_jobs.unfair_tenant_job
    queue = "fair" if fair else "unfair"
    reset()
    func.enqueue_many([("a", i) for i in range(args.backlog)])
    workers = start_workers(queue, args.workers)
    try:
        deadline = time.monotonic() + 600
        while completed(func.name, "a") < args.warm:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start draining")
            check_alive(workers)
            time.sleep(0.05)
        for tenant in SMALL_TENANTS[: args.tenants]:
            for i in range(args.small):
                func.enqueue(tenant, i)
        total = args.backlog + args.tenants * args.small
        while completed(func.name) < total:
            if time.monotonic() > deadline:
                raise RuntimeError("the drain did not finish in 10 minutes")
            time.sleep(0.2)
    finally:
        stop(workers)
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT extract(epoch FROM started_at - created_at) FROM {JOB}"
            " WHERE task = %s AND args ->> 0 <> 'a'",
            [func.name],
        )
        delays = sorted(float(r[0]) for r in cur.fetchall())
        cur.execute(
            f"SELECT count(*) / extract(epoch FROM max(finished_at) - min(started_at))"
            f" FROM {JOB} WHERE task = %s AND args ->> 0 = 'a'",
            [func.name],
        )
        rate = float(cur.fetchone()[0])
    p99 = delays[min(len(delays) - 1, int(0.99 * len(delays)))]
    return {"p50": statistics.median(delays), "p99": p99, "max": delays[-1], "rate": rate}


def drain(args: argparse.Namespace) -> None:
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for rep in range(args.reps):
        for fair in (True, False) if rep % 2 == 0 else (False, True):
            r = one_drain(fair, args)
            results[fair].append(r)
            say(
                f"rep {rep + 1} {'fair' if fair else 'FIFO'}: small tenants' start delay"
                f" p50 {r['p50']:.3f}s p99 {r['p99']:.3f}s max {r['max']:.3f}s;"
                f" A drained at {r['rate']:.0f} jobs/s"
            )
    ratios = [f["rate"] / u["rate"] for f, u in zip(results[True], results[False], strict=True)]
    say(f"A's drain rate, fair / FIFO, per rep: {', '.join(f'{x:.2f}' for x in ratios)}")
    say(f"median ratio {statistics.median(ratios):.2f}")


def weights(args: argparse.Namespace) -> None:
    from django_pgjobs.models import Queue

    reset()
    Queue.objects.create(name="fair", weights={"tenant:a": 3})
    for tenant in "ab":
        fair_jobs.tenant_job.enqueue_many([(tenant, i) for i in range(args.backlog)])
    workers = start_workers("fair", args.workers)
    try:
        while completed(fair_jobs.tenant_job.name) < args.warm:
            check_alive(workers)
            time.sleep(0.05)
        time.sleep(args.secs)
    finally:
        stop(workers)
    with connection.cursor() as cur:
        # the window: from the warm-up's end to --secs later, by the claims' own time
        cur.execute(
            f"WITH w AS (SELECT min(started_at) + make_interval(secs => %s) AS a FROM {JOB})"
            f" SELECT args ->> 0, count(*) FROM {JOB}, w WHERE started_at >= w.a"
            "   AND started_at < w.a + make_interval(secs => %s) GROUP BY 1 ORDER BY 1",
            [args.secs / 10, args.secs * 0.8],
        )
        counts = dict(cur.fetchall())
    a, b = counts.get("a", 0), counts.get("b", 0)
    say(f"started in the window: a {a:,}, b {b:,}; a/b {a / max(b, 1):.3f} (3 wanted)")


def plain(args: argparse.Namespace) -> None:
    from tests.testapp import jobs

    rates: dict[str, list[float]] = {"this": [], "other": []}
    roots = {"this": ROOT, "other": Path(args.other).resolve()}
    for rep in range(args.reps):
        for side in ("this", "other") if rep % 2 == 0 else ("other", "this"):
            reset()
            jobs.noop.enqueue_many([() for _ in range(args.backlog)])
            began = time.monotonic()
            workers = start_workers("default", args.workers, roots[side])
            try:
                while completed(jobs.noop.name) < args.backlog:
                    if time.monotonic() - began > 600:
                        raise RuntimeError("the drain did not finish in 10 minutes")
                    check_alive(workers)
                    time.sleep(0.1)
            finally:
                stop(workers)
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*) / extract(epoch FROM max(finished_at) - min(started_at))"
                    f" FROM {JOB}"
                )
                rates[side].append(float(cur.fetchone()[0]))
            say(f"rep {rep + 1} {side}: {rates[side][-1]:,.0f} jobs/s")
    ratios = [t / o for t, o in zip(rates["this"], rates["other"], strict=True)]
    say(f"this / other per rep: {', '.join(f'{x:.2f}' for x in ratios)}")


def fill(rows: int, keys: int) -> None:
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {JOB}, django_pgjobs_queue")
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, priority, run_at, fair_key, kwargs)"
            " SELECT %(task)s, 'fair', 0, now() - interval '1 minute',"
            "        'tenant:' || lpad((g %% %(keys)s)::text, 5, '0'), '{}'"
            " FROM generate_series(1, %(rows)s) g",
            {"task": fair_jobs.tenant_job.name, "rows": rows, "keys": keys},
        )
        cur.execute(f"VACUUM ANALYZE {JOB}")


def explained(statement: str, params: dict[str, Any]) -> tuple[float, str]:
    """EXPLAIN (ANALYZE, BUFFERS) of ``statement``, its writes rolled back: the
    execution time (ms) and the plan's text."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params)
        lines = [r[0] for r in cur.fetchall()]
        transaction.set_rollback(True)
    ms = float(next(x for x in lines if x.startswith("Execution Time")).split()[2])
    return ms, "\n".join(lines)


WALK_ALL = f"""
WITH RECURSIVE k(key) AS (
    (SELECT fair_key FROM {JOB} WHERE status = 'pending' AND fair_key IS NOT NULL
      AND queue = 'fair' ORDER BY fair_key LIMIT 1)
    UNION ALL
    SELECT (SELECT fair_key FROM {JOB} WHERE status = 'pending' AND fair_key IS NOT NULL
             AND queue = 'fair' AND fair_key > k.key ORDER BY fair_key LIMIT 1)
      FROM k WHERE k.key IS NOT NULL
)
SELECT count(*) FROM k
"""


def explain(args: argparse.Namespace) -> None:
    say(f"filling {args.rows:,} pending jobs over {args.keys:,} keys")
    fill(args.rows, args.keys)
    middle = f"tenant:{args.keys // 2:05d}"
    fair_params = {
        "worker": "bench",
        "queue": "fair",
        "n": 10,
        "cursor": middle,
        "used": 1,
        "tasks": None,
    }
    plain_params = {"worker": "bench", "queue": "fair", "n": 10, "since": UNBOUNDED}
    plain = claim_statements(connection)["JOB_CLAIM_ONE_QUEUE"]
    times: dict[str, list[float]] = {"fair": [], "plain": [], "walk every key": []}
    plan = ""
    for _ in range(args.reps):
        ms, plan = explained(JOB_CLAIM_FAIR, fair_params)
        times["fair"].append(ms)
        times["plain"].append(explained(plain, plain_params)[0])
        times["walk every key"].append(explained(WALK_ALL, {})[0])
    print(plan)
    for name, values in times.items():
        say(f"{name}: median {statistics.median(values):.2f} ms (min {min(values):.2f})")


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    d = sub.add_parser("drain")
    d.add_argument("--backlog", type=int, default=100_000)
    d.add_argument("--warm", type=int, default=2_000)
    d.add_argument("--tenants", type=int, default=10)
    d.add_argument("--small", type=int, default=10)
    d.add_argument("--workers", type=int, default=2)
    d.add_argument("--reps", type=int, default=1)
    w = sub.add_parser("weights")
    w.add_argument("--backlog", type=int, default=200_000)
    w.add_argument("--warm", type=int, default=2_000)
    w.add_argument("--secs", type=float, default=60.0)
    w.add_argument("--workers", type=int, default=2)
    p = sub.add_parser("plain")
    p.add_argument("--other", required=True)
    p.add_argument("--backlog", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reps", type=int, default=4)
    e = sub.add_parser("explain")
    e.add_argument("--rows", type=int, default=1_000_000)
    e.add_argument("--keys", type=int, default=1_000)
    e.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    {"drain": drain, "weights": weights, "plain": plain, "explain": explain}[args.mode](args)


if __name__ == "__main__":
    main()
