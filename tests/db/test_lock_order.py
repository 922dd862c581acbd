"""One lock order, and a mixed run that proves it.

Every statement that *waits* for job row locks takes them in id order: the heartbeat,
the release of jobs not started and the completer's redo form lock ``ORDER BY id FOR NO KEY UPDATE`` first, the hot
completion walks its id-sorted list through the primary key, cancel and the admin's
retry lock their selection ``ORDER BY id``, and a workflow release locks the rows the
statement changes, then their children by id (always newer rows). The claim and the
reaper take rows ``FOR UPDATE SKIP LOCKED``: they never wait for a row, so they can
close no cycle. Held limit slots and the queue/worker rows are written after the job
rows, never before.

The test runs all of them at once from threads, each on its own connection to the
real server: enqueues, three claim/heartbeat/complete/retry loops (one of which
stalls so the reaper takes its jobs), the reaper, cancels and admin retries. No
statement may raise ``deadlock detected`` and the server's own counter
(``pg_stat_database.deadlocks``) must not move. ``PGJOBS_DEADLOCK_SECONDS`` sets how
long (CI: 30 s; the 10-minute run on docs/explanation/how-a-claim-works.md).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from django.db import OperationalError, connection, connections

from django_pgjobs import claim
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.job_admin import job_cancel, job_retry_now
from django_pgjobs.db.job_outcome import (
    job_complete_many,
    job_heartbeat,
    job_release_many,
    job_retry,
)
from django_pgjobs.db.reap import job_reap_stale
from django_pgjobs.support.error_entries import error_entry
from tests.testapp import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.scale]

SECONDS = float(os.environ.get("PGJOBS_DEADLOCK_SECONDS", "30"))
QUEUE = "lock-order"
STALE_AFTER = 0.5


def _deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


class Mix:
    """The shared state of the run: what each loop did, and every deadlock seen."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds
        self.done = Counter[str]()
        self.deadlocks: list[str] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def running(self) -> bool:
        return time.monotonic() < self.until

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.done[what] += n

    def loop(self, name: str, step: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                while self.running():
                    try:
                        step()
                    except OperationalError as exc:
                        cause = exc.__cause__
                        if getattr(cause, "sqlstate", None) == "40P01":
                            with self.lock:
                                self.deadlocks.append(f"{name}: {exc}")
                        else:
                            with self.lock:
                                self.errors.append(f"{name}: {exc!r}")
                        connections["default"].close()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                with self.lock:
                    self.errors.append(f"{name} died: {exc!r}")
            finally:
                connections["default"].close()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread


def _sample(statuses: tuple[str, ...], n: int) -> list[int]:
    """Random ids of the mix in these statuses (not the stalling worker's: the reaper's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM django_pgjobs_job WHERE queue = %s AND status = ANY(%s)"
            " AND worker IS DISTINCT FROM 'worker-0' ORDER BY random() LIMIT %s",
            [QUEUE, list(statuses), n],
        )
        return [r[0] for r in cursor.fetchall()]


def _worker(mix: Mix, name: str, *, stalls: bool) -> Callable[[], None]:
    """Claim a batch, beat for it a few times while finishing it in parts: most
    complete (the hot form), some fail and are retried at once; the stalling one
    sometimes stops beating so the reaper takes its jobs (its later writes are fenced)."""
    rng = random.Random(name)

    def step() -> None:
        held: list[Claimed] = claim.claim(connection, worker=name, queues=[QUEUE], n=50)
        mix.count("claimed", len(held))
        while held and mix.running():
            lost = job_heartbeat(connection, [(c.id, c.lease) for c in held])
            mix.count("heartbeats")
            held = [c for c in held if c.id not in lost]
            if stalls and rng.random() < 0.3:
                time.sleep(STALE_AFTER * 2)  # the reaper's turn
            part, held = held[: rng.randint(1, 20)], held[20:] if len(held) > 20 else []
            failing = [c for c in part if rng.random() < 0.1]
            completing = [c for c in part if c not in failing]
            if completing:
                done = job_complete_many(
                    connection, [(c.id, c.lease, None) for c in completing], redo=False
                )
                mix.count("completed", len(done))
            for c in failing:
                error = error_entry(c.attempt, ValueError("mixed run"), name)
                if job_retry(connection, id=c.id, lease=c.lease, delay=0, error=error):
                    mix.count("retried")
            if held and rng.random() < 0.1:  # a stop: the rest, not started, given back
                told = [(c.id, c.lease) for c in held]
                mix.count("released", len(job_release_many(connection, told)))
                held = []

    return step


@pytest.mark.timeout(SECONDS + 180)
def test_a_mixed_run_of_every_row_locking_statement_has_no_deadlock() -> None:
    before = _deadlocks()
    mix = Mix(SECONDS)

    def enqueue() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM django_pgjobs_job WHERE queue = %s AND status = 'pending'",
                [QUEUE],
            )
            backlog = cursor.fetchone()[0]
        if backlog > 500:  # a small pool: the loops keep meeting on the same rows
            time.sleep(0.05)
            return
        n = jobs.add.using(queue=QUEUE, max_attempts=20).enqueue_many([(i, i) for i in range(100)])
        mix.count("enqueued", n)

    def reap() -> None:
        mix.count("reaped", len(job_reap_stale(connection, stale_after=STALE_AFTER)))
        time.sleep(0.05)

    def cancel() -> None:
        # Mostly running rows: the ones the heartbeats and completions lock too.
        statuses = ("running",) if random.random() < 0.8 else ("pending", "running")
        mix.count("cancelled", len(job_cancel(connection, _sample(statuses, 30))))

    def retry_now() -> None:
        ids = _sample(("cancelled", "dead"), 20)
        mix.count("admin_retried", len(job_retry_now(connection, ids, stale_after=60).changed))
        time.sleep(0.02)

    threads = [
        mix.loop("enqueue", enqueue),
        *(mix.loop(f"worker-{i}", _worker(mix, f"worker-{i}", stalls=i == 0)) for i in range(3)),
        mix.loop("reaper", reap),
        mix.loop("cancel-1", cancel),
        mix.loop("cancel-2", cancel),
        mix.loop("retry-now", retry_now),
    ]
    for thread in threads:
        thread.join(timeout=SECONDS + 60)
    assert not any(t.is_alive() for t in threads), "a loop did not end"
    assert mix.errors == [], mix.errors
    assert mix.deadlocks == [], mix.deadlocks
    # Every kind of statement really ran, many times, side by side.
    kinds = ("enqueued", "claimed", "heartbeats", "completed", "retried", "reaped", "released")
    kinds += ("cancelled", "admin_retried")
    assert all(mix.done[k] > 0 for k in kinds), dict(mix.done)
    # The server flushes a backend's counters within a second of it going idle (the
    # loops' connections are closed): give a deadlock the chance to show.
    deadline = time.monotonic() + 3
    after = _deadlocks()
    while after == before and time.monotonic() < deadline:
        time.sleep(0.2)
        after = _deadlocks()
    assert after == before, f"pg_stat_database.deadlocks went from {before} to {after}"
    print(f"mixed run of {SECONDS:g}s: {dict(mix.done)}")  # the figures for the docs
