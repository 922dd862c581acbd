"""How soon a signal's or an event's commit gets its waiting job claimed: ``runjobs``
workers (``--workers``, default 4) whose idle poll is 30 s, so only the commit's
NOTIFY wakes them in time.

    DATABASE_URL=postgres://.../scratch scripts/dev python bench/signal_wake.py --jobs 200

It migrates the database it is given (use a scratch one: it empties the jobs table),
starts the workers, enqueues ``--jobs`` jobs that wait for a signal and as many that
wait for an event (each its own key), waits until all are parked, then sends each
signal (and emits each event) in its own transaction, ``--gap`` seconds apart. The
latency of one wake is the job's claim (``started_at`` of its second run) less the
signal's or the event's ``created_at``, both read from the database's clock; it
prints p50, p99 and the largest, per kind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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

from django_pgjobs import emit_event, send_signal  # noqa: E402
from tests import signal_jobs  # noqa: E402


def sql(statement: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"signal_wake: timed out waiting for {what}")
        time.sleep(0.05)


def count(status: str) -> int:
    return int(sql("SELECT count(*) FROM django_pgjobs_job WHERE status = %s", [status])[0][0])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per kind")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between two wakes")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    sql("TRUNCATE django_pgjobs_job, django_pgjobs_jobsignal, django_pgjobs_jobevent")
    env = {**os.environ, "PGJOBS_TEST_POLL_INTERVAL": "30", "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "runjobs", "--queues", "durable",
             "--concurrency", "8", "--verbosity", "0"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for _ in range(args.workers)
    ]  # fmt: skip
    try:
        signalled = [signal_jobs.approval.enqueue().id for _ in range(args.jobs)]
        evented = [signal_jobs.paid.enqueue(f"bench-{i}").id for i in range(args.jobs)]
        wait_for(lambda: count("waiting") == 2 * args.jobs, 120, "every job to park")
        time.sleep(1.0)  # past the workers' idle polls: only a NOTIFY wakes them now
        for i, job_id in enumerate(signalled):
            send_signal(job_id, "approval", i)
            time.sleep(args.gap)
        for i in range(args.jobs):
            emit_event("invoice.paid", key=f"bench-{i}", payload=i)
            time.sleep(args.gap)
        wait_for(lambda: count("completed") == 2 * args.jobs, 120, "every job to complete")
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(30)
    signal_lag = sql(
        "SELECT extract(epoch FROM j.started_at - s.created_at) FROM django_pgjobs_job j"
        " JOIN django_pgjobs_jobsignal s ON s.job_id = j.id WHERE j.id = ANY(%s)",
        [signalled],
    )
    event_lag = sql(
        "SELECT extract(epoch FROM j.started_at - e.created_at) FROM django_pgjobs_job j"
        " JOIN django_pgjobs_jobevent e ON e.key = j.args->>0"
        " WHERE j.id = ANY(%s)",
        [evented],
    )
    print(f"{args.workers} workers, {args.jobs} jobs per kind, a wake every {args.gap:g}s")
    for kind, rows in (("signal", signal_lag), ("event", event_lag)):
        lags = [float(r[0]) * 1000 for r in rows]  # type: ignore[arg-type]
        print(
            f"{kind}: commit -> claim p50 {statistics.median(lags):.1f} ms,"
            f" p99 {percentile(lags, 0.99):.1f} ms, max {max(lags):.1f} ms (n={len(lags)})"
        )


if __name__ == "__main__":
    main()
