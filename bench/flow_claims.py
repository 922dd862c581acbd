"""Claim cost with and without flow control, in one process on one connection.

    DJANGO_SETTINGS_MODULE=tests.settings scripts/dev python bench/flow_claims.py [--secs 3]

Fills the jobs table with 100,000 due rows (1,000 distinct concurrency keys in the
keyed groups), then claims batches of 10 for --secs seconds, keeping 40 jobs
"running" (the oldest 10 are completed after each claim, as a worker's completer
would). Within a group the plain claim and the claim under test alternate call by
call on the same table, and each call is timed: the result is microseconds of
claim per claimed job and its ratio to the plain claim, so load from other work on
a shared machine hits both sides alike. The table is refilled and vacuumed before
each group.

With no queue limited and no task keyed, a worker runs exactly the plain claim
(the "plain claim" row is the fast path); it adds a task filter only after it met a
job of a task it does not know ("after skew").

It needs a migrated database (``migrate`` on DATABASE_URL) and TRUNCATEs the jobs
table there: never point it at a database whose jobs you want to keep.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import django

django.setup()

from django.db import connection  # noqa: E402

from django_pgjobs import claim  # noqa: E402
from django_pgjobs.claim.rows import Claimed  # noqa: E402
from django_pgjobs.db.job_outcome import job_complete_many  # noqa: E402
from django_pgjobs.db.tables import JOB, QUEUE  # noqa: E402

ROWS = 100_000
KEYS = 1_000
TASK = "bench.noop"
TASKS = (TASK, *(f"bench.other_{i}" for i in range(99)))  # a registry of 100 tasks


def fill(keyed: bool) -> None:
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {JOB}, {QUEUE}")
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, run_at, concurrency_key, concurrency_limit)"
            " SELECT %(task)s, 'bench', now() - interval '1 minute',"
            "        CASE WHEN %(keyed)s THEN 'k' || (g %% %(keys)s) END,"
            "        CASE WHEN %(keyed)s THEN 1 END"
            " FROM generate_series(1, %(rows)s) g",
            {"task": TASK, "keyed": keyed, "keys": KEYS, "rows": ROWS},
        )
        cur.execute(f"VACUUM ANALYZE {JOB}")


def limit_queue(**fields: Any) -> None:
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {QUEUE} (name, paused, max_running, rate, rate_log,"
            " updated_at) VALUES ('bench', false, %s, %s, '[]', now())",
            [fields.get("max_running"), fields.get("rate")],
        )


def drive(claims: dict[str, Callable[[int], list[Claimed]]], secs: float) -> dict[str, float]:
    """Round-robin the claim methods on the same table, timing each call: microseconds
    of claim statement per claimed job, per method (load on the machine hits all of
    them alike)."""
    inflight: deque[Claimed] = deque()
    spent = dict.fromkeys(claims, 0.0)
    got_jobs = dict.fromkeys(claims, 0)
    start = time.perf_counter()
    while time.perf_counter() - start < secs:
        for name, method in claims.items():
            t0 = time.perf_counter()
            got = method(10)
            spent[name] += time.perf_counter() - t0
            got_jobs[name] += len(got)
            inflight.extend(got)
            if len(inflight) >= 40 or not got:
                done = [inflight.popleft() for _ in range(min(10, len(inflight)))]
                job_complete_many(connection, [(c.id, c.lease, None) for c in done])
    return {name: 1e6 * spent[name] / max(1, got_jobs[name]) for name in claims}


def _claim(**options: Any) -> Callable[[int], list[Claimed]]:
    return lambda n: claim.claim(connection, worker="b", queues=["bench"], n=n, **options)


BASE = "plain claim (no task filter)"
#: (keyed rows, queue limits, claim methods compared on that table)
GROUPS: list[tuple[bool, dict[str, Any], dict[str, Callable[[int], list[Claimed]]]]] = [
    (False, {}, {BASE: _claim(), "after skew: task filter": _claim(tasks=TASKS)}),
    (
        False,
        {"max_running": 1000},
        {BASE: _claim(), "limited: max_running=1000": _claim(tasks=TASKS, limited=True)},
    ),
    (True, {}, {BASE: _claim(), "limited: 1,000 keys, limit 1": _claim(tasks=TASKS, limited=True)}),
    (
        True,
        {"rate": "100000/s"},
        {BASE: _claim(), "limited: keys + rate 100000/s": _claim(tasks=TASKS, limited=True)},
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--secs", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    ratios: dict[str, list[float]] = {}
    micros: dict[str, list[float]] = {}
    for _ in range(options.rounds):
        for keyed, limits, group in GROUPS:
            fill(keyed)
            if limits:
                limit_queue(**limits)
            result = drive(group, options.secs)
            for name, us in result.items():
                if name != BASE:
                    micros.setdefault(name, []).append(us)
                    ratios.setdefault(name, []).append(us / result[BASE])
            micros.setdefault(BASE, []).append(result[BASE])
    if options.json:
        print(json.dumps({"us_per_job": micros, "cost_vs_0_1": ratios}, indent=2))
    print(
        f"{ROWS:,} due rows; claims of 10 with 40 running; {options.rounds} rounds of "
        f"{options.secs:g} s per group"
    )
    print(f"{'scenario':34} {'us/job (median)':>16} {'cost vs 0.1':>12}   ratio per round")
    print(f"{BASE:34} {statistics.median(micros[BASE]):16.0f} {1.0:12.2f}")
    for name, values in ratios.items():
        print(
            f"{name:34} {statistics.median(micros[name]):16.0f} "
            f"{statistics.median(values):12.2f}   " + " ".join(f"{v:.2f}" for v in values)
        )


if __name__ == "__main__":
    main()
