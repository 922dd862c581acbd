"""Scenario 7 (model): Hypothesis drives random interleavings of enqueue, claim,
heartbeat, complete, fail, release, time passing, reap, cancel and admin retry
through the product's own statements (``django_pgjobs.db``) against the real
PostgreSQL of the suite, and checks the invariants after every step:

* one live lease per job: every running row is held by exactly one simulated
  claim carrying its current lease, and leases handed out only grow;
* a fenced write succeeds iff its lease is current and the job is running;
* terminal states change only through an admin retry;
* attempts <= max_attempts; finished_at is set iff the status is terminal.
"""

from __future__ import annotations

from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from django_pgjobs import claim
from django_pgjobs.db.job_admin import job_cancel, job_retry_now
from django_pgjobs.db.job_outcome import (
    job_complete_many,
    job_dead,
    job_heartbeat,
    job_release,
    job_retry,
)
from django_pgjobs.db.reap import job_reap_stale
from tests.faults.conftest import DBNAME

TERMINAL = {"completed", "dead", "cancelled"}
STALE = 60.0
ERROR = {"attempt": 1, "type": "builtins.ValueError", "message": "x", "traceback": None}


class QueueMachine(RuleBasedStateMachine):
    conn: psycopg.Connection  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.conn.execute(
            "TRUNCATE django_pgjobs_job, django_pgjobs_jobstep, django_pgjobs_jobresult, django_pgjobs_jobdependency,"
            " django_pgjobs_jobsignal"
        )
        self.held: list[tuple[int, int, int, int]] = []  # (id, lease, attempt, max_attempts)
        self.max_lease: dict[int, int] = {}
        self.before: dict[int, str] = {}
        self.last_rule = ""

    # ------------------------------------------------------------------ helpers

    def rows(self) -> dict[int, tuple[Any, ...]]:
        return {
            r[0]: r
            for r in self.conn.execute(
                "SELECT id, status, lease, attempts, max_attempts, finished_at"
                " FROM django_pgjobs_job"
            ).fetchall()
        }

    def current(self, job_id: int, lease: int) -> bool:
        row = self.rows().get(job_id)
        return row is not None and row[1] == "running" and row[2] == lease

    def take_held(self, data: st.DataObject) -> tuple[int, int, int, int]:
        index = data.draw(st.integers(0, len(self.held) - 1))
        return self.held.pop(index)

    def step(self, name: str) -> None:
        self.before = {i: r[1] for i, r in self.rows().items()}
        self.last_rule = name

    # ------------------------------------------------------------------ rules

    @initialize(max_attempts=st.lists(st.integers(1, 3), min_size=1, max_size=4))
    def some_jobs(self, max_attempts: list[int]) -> None:
        for n in max_attempts:
            self.enqueue(n, "a")

    @rule(max_attempts=st.integers(1, 3), queue=st.sampled_from(["a", "b"]))
    def enqueue(self, max_attempts: int, queue: str) -> None:
        self.step("enqueue")
        self.conn.execute(
            "INSERT INTO django_pgjobs_job (task, args, kwargs, max_attempts, queue)"
            " VALUES ('tests.testapp.jobs.noop', '[]', '{}', %s, %s)",
            [max_attempts, queue],
        )

    @rule(n=st.integers(1, 3), queues=st.sampled_from([None, ["a"], ["a", "b"]]))
    def claim(self, n: int, queues: list[str] | None) -> None:
        self.step("claim")
        for c in claim.claim(self.conn, worker="w", queues=queues, n=n):
            assert c.lease > self.max_lease.get(c.id, 0), "a lease was handed out twice"
            assert c.attempt <= c.max_attempts
            self.max_lease[c.id] = c.lease
            self.held.append((c.id, c.lease, c.attempt, c.max_attempts))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        """One worker (a random subset of the claims) refreshes its in-flight jobs."""
        self.step("heartbeat")
        mine = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique=True))
        expected_lost = {i for i, lease, _, _ in mine if not self.current(i, lease)}
        live = {i for i, lease, _, _ in mine if self.current(i, lease)}
        beats = dict(self.conn.execute("SELECT id, heartbeat_at FROM django_pgjobs_job").fetchall())
        lost = job_heartbeat(self.conn, [(i, lease) for i, lease, _, _ in mine])
        assert lost == expected_lost
        after = dict(self.conn.execute("SELECT id, heartbeat_at FROM django_pgjobs_job").fetchall())
        for i in after:
            if i not in live:  # only this worker's live jobs may be touched
                assert after[i] == beats.get(i), f"a stale heartbeat refreshed job {i}"

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self.step("complete")
        job_id, lease, _, _ = self.take_held(data)
        ours = self.current(job_id, lease)
        assert bool(job_complete_many(self.conn, [(job_id, lease, None)])) == ours

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        self.step("fail")
        job_id, lease, attempt, max_attempts = self.take_held(data)
        ours = self.current(job_id, lease)
        if attempt < max_attempts:  # the executor's rule
            done = job_retry(self.conn, id=job_id, lease=lease, delay=0.0, error=ERROR) is not None
        else:
            done = job_dead(self.conn, id=job_id, lease=lease, error=ERROR)
        assert done == ours

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.step("release")
        job_id, lease, _, _ = self.take_held(data)
        ours = self.current(job_id, lease)
        assert job_release(self.conn, id=job_id, lease=lease) == ours

    @rule()
    def time_passes(self) -> None:
        """Every running job's heartbeat goes stale (its worker froze)."""
        self.step("time_passes")
        self.conn.execute(
            "UPDATE django_pgjobs_job SET heartbeat_at = now() - interval '1 hour'"
            " WHERE status = 'running'"
        )

    @rule()
    def reap(self) -> None:
        self.step("reap")
        job_reap_stale(self.conn, stale_after=STALE)

    @precondition(lambda self: self.held)
    @rule()
    def takeover(self) -> None:
        """The common fault in one step: workers freeze, the reaper reclaims, another claims."""
        self.time_passes()
        self.reap()
        self.claim(3, None)
        self.last_rule = "takeover"

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.step("cancel")
        ids = list(self.rows())
        if ids:
            job_cancel(self.conn, [data.draw(st.sampled_from(ids))])

    @rule(data=st.data())
    def admin_retry(self, data: st.DataObject) -> None:
        self.step("admin_retry")
        ids = list(self.rows())
        if ids:
            job_retry_now(self.conn, [data.draw(st.sampled_from(ids))], stale_after=STALE)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def invariants(self) -> None:
        rows = self.rows()
        for job_id, (_, status, lease, attempts, max_attempts, finished_at) in rows.items():
            assert attempts <= max_attempts, (job_id, attempts, max_attempts)
            assert (finished_at is not None) == (status in TERMINAL), (job_id, status)
            holders = [h for h in self.held if h[0] == job_id and h[1] == lease]
            if status == "running":
                assert len(holders) == 1, f"job {job_id} running with {len(holders)} live leases"
            else:
                assert not holders, f"job {job_id} is {status} yet a claim holds its lease"
            was = self.before.get(job_id)
            if was in TERMINAL and status != was:
                assert self.last_rule == "admin_retry", (job_id, was, status, self.last_rule)


def test_random_interleavings_keep_the_invariants(db, cluster) -> None:
    with psycopg.connect(cluster.dsn(DBNAME), autocommit=True) as conn:
        QueueMachine.conn = conn
        run = QueueMachine.TestCase
        run.settings = settings(
            max_examples=150,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        run().runTest()
