"""What durable jobs cost: a job of ten ``context.step`` calls against the same job
making ten plain single-row writes, and a drain with 10,000 waiting jobs in the table
against one without.

    DATABASE_URL=postgres://.../scratch scripts/dev python bench/durable_steps.py --jobs 300 --rounds 3

It migrates the database it is given (use a scratch one: it empties the jobs table),
runs the jobs in this process with ``testing.run_jobs`` (claim, run, fenced write:
the worker's path, one job at a time) and prints per-job times as the median (min-max)
over the rounds, which alternate the order of the two kinds. Then it parks 10,000
jobs as ``waiting`` (rows written as a park leaves them), drains 2,000 no-op jobs with
and without them, and prints the claim's plan, the drain rates and the bytes a
waiting job adds (its row beside its arguments, its entry in the waiting index).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from django_pgjobs.testing import run_jobs  # noqa: E402
from tests import durable_jobs  # noqa: E402
from tests.testapp import jobs  # noqa: E402


def sql(statement: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def per_job(kind: str, n: int) -> float:
    task = durable_jobs.ten_steps if kind == "steps" else durable_jobs.ten_writes
    task.enqueue_many([()] * n)
    start = time.perf_counter()
    ran = run_jobs(["durable-bench"])
    elapsed = time.perf_counter() - start
    assert len(ran) == n and all(r.status == "completed" for r in ran), ran[:3]
    return elapsed / n


def drain(n: int) -> float:
    jobs.noop.enqueue_many([()] * n)
    start = time.perf_counter()
    ran = run_jobs(["default"])
    assert len(ran) == n
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--drain", type=int, default=2_000)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    sql("TRUNCATE django_pgjobs_job, django_pgjobs_jobstep")
    sql("CREATE TABLE IF NOT EXISTS durable_bench_rows (id bigserial PRIMARY KEY, n int)")
    times: dict[str, list[float]] = {"steps": [], "writes": []}
    for r in range(args.rounds):
        for kind in ("steps", "writes") if r % 2 == 0 else ("writes", "steps"):
            times[kind].append(per_job(kind, args.jobs))
    for kind, values in times.items():
        print(
            f"job of ten {kind:6}: {statistics.median(values) * 1e3:.2f} ms "
            f"({min(values) * 1e3:.2f}-{max(values) * 1e3:.2f}) per job"
        )
    ratio = statistics.median(times["steps"]) / statistics.median(times["writes"])
    print(f"steps / writes: {ratio:.2f}x")

    sql("TRUNCATE django_pgjobs_job, django_pgjobs_jobstep")
    without = [drain(args.drain) for _ in range(args.rounds)]
    sql(
        "INSERT INTO django_pgjobs_job (task, queue, args, status, run_at, waiting_for)"
        " SELECT 'tests.durable_jobs.sleeps', 'default', '[86400]', 'waiting',"
        ' now() + interval \'1 day\', \'{"kind": "sleep", "name": "wait"}\''
        " FROM generate_series(1, %s)",
        [args.waiting],
    )
    sql("ANALYZE django_pgjobs_job")
    with_waiting = [drain(args.drain) for _ in range(args.rounds)]
    print(
        f"drain of {args.drain} no-op jobs: {statistics.median(without):,.0f}/s without, "
        f"{statistics.median(with_waiting):,.0f}/s with {args.waiting:,} waiting "
        f"({statistics.median(with_waiting) / statistics.median(without):.2f}x)"
    )
    row = sql(
        "SELECT avg(pg_column_size(j.*) - pg_column_size(j.args) - pg_column_size(j.kwargs)),"
        " pg_relation_size('pgjobs_job_waiting_idx')::float / count(*)"
        " FROM django_pgjobs_job j WHERE status = 'waiting'"
    )[0]
    print(
        f"a waiting job: {row[0]:.0f} bytes of row beside its arguments, {row[1]:.0f} bytes of index"
    )
    jobs.noop.enqueue()
    plan = sql(
        "EXPLAIN SELECT id FROM django_pgjobs_job WHERE status = 'pending' AND queue = 'default'"
        " AND run_at <= now() ORDER BY priority DESC, run_at, id LIMIT 10 FOR UPDATE SKIP LOCKED"
    )
    print("claim's scan:", next(p[0].strip() for p in plan if "Scan" in str(p[0])))


if __name__ == "__main__":
    main()
