"""Scenario 7 (processes): several worker processes x threads drain 20,000 jobs
across queues, priorities and run_at, with no fault injected.

Afterwards: every job ran exactly once (one effect row, attempts = 1), claim
order within each queue was honoured, and the server never logged a deadlock.
"""

from __future__ import annotations

import bisect
import os
import time
from datetime import UTC, timedelta

import pytest

from tests.faults.conftest import Workers, status_counts

COUNT = "tests.testapp.jobs.fault_count"
TOTAL = int(os.environ.get("PGJOBS_FAULTS_CONTENTION_JOBS", "20000"))
#: Two claim statements running at the same moment may each skip a row the other
#: holds; order is judged between claims further apart than this.
ORDER_TOLERANCE = timedelta(seconds=0.25)


def order_violations(rows: list[tuple]) -> list[tuple]:
    """Jobs claimed after a later-in-order job of the same queue that was claimed
    clearly earlier while they were already due.

    rows: (queue, started_at, priority, run_at, id). Key: priority DESC, run_at, id.
    """
    by_queue: dict[str, list[tuple]] = {}
    for r in rows:
        by_queue.setdefault(r[0], []).append(r)
    bad: list[tuple] = []
    for jobs in by_queue.values():
        jobs.sort(key=lambda r: r[1])
        starts = [r[1] for r in jobs]
        keys = [(-r[2], r[3], r[4]) for r in jobs]
        # Sparse table for range-max of keys over positions in started_at order.
        table = [keys]
        span = 1
        while span * 2 <= len(keys):
            prev = table[-1]
            table.append([max(prev[i], prev[i + span]) for i in range(len(keys) - 2 * span + 1)])
            span *= 2

        def range_max(lo: int, hi: int, table: list[list[tuple]] = table) -> tuple | None:
            if lo > hi:
                return None
            level = (hi - lo + 1).bit_length() - 1
            return max(table[level][lo], table[level][hi - (1 << level) + 1])

        for x, key in zip(jobs, keys, strict=True):
            lo = bisect.bisect_left(starts, x[3])  # Y started once X was due
            hi = bisect.bisect_left(starts, x[1] - ORDER_TOLERANCE) - 1  # clearly before X
            worst = range_max(lo, hi)
            if worst is not None and worst > key:
                bad.append((x, worst))
    return bad


def drained_while_progressing(db, total: int, stall: float = 90.0, cap: float = 900.0) -> bool:
    """Wait for ``total`` completions while the count keeps rising: what the test checks
    is exactly-once and order, not speed (on a loaded two-core box a fixed deadline is
    a coin toss). False after ``stall`` seconds without one
    more completion, or ``cap`` in all."""
    start = best_at = time.monotonic()
    best = -1
    while time.monotonic() - start < cap:
        done = status_counts(db).get("completed", 0)
        if done == total:
            return True
        if done > best:
            best, best_at = done, time.monotonic()
        elif time.monotonic() - best_at > stall:
            return False
        time.sleep(0.5)
    return False


@pytest.mark.timeout(1200)
def test_drain_20k_exactly_once_in_order_without_deadlocks(db, workers: Workers, cluster) -> None:
    db.execute("SELECT setseed(0.7)")
    db.execute(
        "INSERT INTO django_pgjobs_job (task, args, kwargs, max_attempts, queue, priority, run_at)"
        " SELECT %s, '[]', '{}', 5, 'q' || (random() * 3)::int, (random() * 10)::int - 5,"
        "        now() + CASE WHEN random() < 0.2 THEN random() * interval '3 seconds'"
        "                     ELSE interval '0' END"
        " FROM generate_series(1, %s)",
        [COUNT, TOTAL],
    )
    log_start = len(cluster.server_log())
    # Different claim statements compete: every queue, a pair of queues, one queue.
    for queues in ("*", "q0,q1", "q2", "q3,q1"):
        workers.start("--queues", queues, "--concurrency", "3", "--batch", "20")
    assert drained_while_progressing(db, TOTAL), f"stalled: {status_counts(db)}"
    assert status_counts(db) == {"completed": TOTAL}

    once = db.execute(
        "SELECT count(*) FILTER (WHERE n = 1), count(*) FROM (SELECT j.id, count(e.id) n"
        " FROM django_pgjobs_job j LEFT JOIN fault_effects e ON e.job_id = j.id"
        " GROUP BY j.id) x"
    ).fetchone()
    assert once == (TOTAL, TOTAL), "a job ran twice or never"
    assert db.execute(
        "SELECT max(attempts), min(attempts), max(lease) FROM django_pgjobs_job"
    ).fetchone() == (1, 1, 1)
    rows = db.execute(
        "SELECT queue, started_at, priority, run_at, id FROM django_pgjobs_job"
    ).fetchall()
    bad = order_violations(rows)
    assert not bad, f"{len(bad)} claim-order violations, e.g. {bad[:3]}"
    assert "deadlock detected" not in cluster.server_log()[log_start:]


@pytest.mark.parametrize(
    "claimed_first,claimed_later,expected",
    [
        ((0, 5, 1), (0, 0, 2), 0),  # higher priority first: fine
        ((0, 0, 2), (0, 5, 1), 1),  # a higher-priority due job claimed clearly later: violation
    ],
)
def test_order_check_catches_violations(claimed_first, claimed_later, expected) -> None:
    """The checker itself can fail (a test that cannot fail proves nothing)."""
    from datetime import datetime

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        ("q", t0 + timedelta(seconds=s), p, t0, i)
        for s, p, i in (claimed_first, (claimed_later[0] + 1, *claimed_later[1:]))
    ]
    assert len(order_violations(rows)) == expected
