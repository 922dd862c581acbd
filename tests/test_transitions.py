"""Every state transition, driven from ``states.ALLOWED_TRANSITIONS``.

Each operation of ``sql.py`` is applied to a row in every status: where the state
machine allows the move, the row moves (and only as described); everywhere else,
and for every write carrying a stale lease, the row is left exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection

from django_pgjobs import sql
from django_pgjobs.models import Job, JobResult
from django_pgjobs.states import ALLOWED_TRANSITIONS, JobStatus, can_move
from tests.rows import make_job, snapshot

pytestmark = pytest.mark.django_db

ERROR = {"attempt": 1, "type": "builtins.ValueError", "message": "boom", "traceback": "tb"}
STALE = 3600.0  # heartbeat age used for "stuck" rows (far beyond STALE_AFTER)


@dataclass(frozen=True)
class Op:
    """One statement of sql.py: where it may start, where it leads."""

    name: str
    apply: Callable[[Job], Any]
    moves: dict[str, str]  # from status -> to status (a running row must be stale for some)
    needs_stale: bool = False


def _claim(job: Job) -> Any:
    return sql.claim(connection, worker="w-test", queues=[job.queue], n=1)


OPS = [
    Op("claim", _claim, {JobStatus.PENDING: JobStatus.RUNNING}),
    Op(
        "complete",
        lambda j: sql.complete_many(connection, [(j.id, j.lease, {"v": 1})]),
        {JobStatus.RUNNING: JobStatus.COMPLETED},
    ),
    Op(
        "retry",
        lambda j: sql.retry(connection, id=j.id, lease=j.lease, delay=60, error=ERROR),
        {JobStatus.RUNNING: JobStatus.PENDING},
    ),
    Op(
        "dead",
        lambda j: sql.dead(connection, id=j.id, lease=j.lease, error=ERROR),
        {JobStatus.RUNNING: JobStatus.DEAD},
    ),
    Op(
        "release",
        lambda j: sql.release(connection, id=j.id, lease=j.lease),
        {JobStatus.RUNNING: JobStatus.PENDING},
    ),
    Op(
        "reap",
        lambda j: sql.reap(connection, stale_after=60),
        {JobStatus.RUNNING: JobStatus.PENDING},
        needs_stale=True,
    ),
    Op(
        "cancel",
        lambda j: sql.cancel(connection, [j.id]),
        {JobStatus.PENDING: JobStatus.CANCELLED, JobStatus.RUNNING: JobStatus.CANCELLED},
    ),
    Op(
        "retry_now",
        lambda j: sql.retry_now(connection, [j.id], stale_after=60),
        {
            JobStatus.DEAD: JobStatus.PENDING,
            JobStatus.CANCELLED: JobStatus.PENDING,
            JobStatus.RUNNING: JobStatus.PENDING,
        },
        needs_stale=True,
    ),
]
OPS_BY_NAME = {op.name: op for op in OPS}
ALL_STATUSES = [s.value for s in JobStatus]


def _queue(op: Op, status: str) -> str:
    return f"q-{op.name}-{status}"


def test_every_allowed_transition_has_an_operation() -> None:
    covered = {(src, dst) for op in OPS for src, dst in op.moves.items()}
    assert covered == set(ALLOWED_TRANSITIONS)
    # And the reaper's other exit (no attempts left), checked in test_reap_out_of_attempts.
    assert can_move(JobStatus.RUNNING, JobStatus.DEAD)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("status", ALL_STATUSES)
def test_operation_from_every_status(op: Op, status: str) -> None:
    job = make_job(status, queue=_queue(op, status), heartbeat_age=STALE if op.needs_stale else 0.0)
    before = snapshot(job.id)
    op.apply(job)
    after = snapshot(job.id)
    if status not in op.moves:
        assert after == before, f"{op.name} changed a {status} row"
        return
    dst = op.moves[status]
    assert can_move(status, dst)
    assert after["status"] == dst
    _check_move(op.name, before, after)


def _check_move(name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """What else each operation must (and must not) change."""
    if name == "claim":
        assert after["attempts"] == before["attempts"] + 1
        assert after["lease"] == before["lease"] + 1
        assert after["heartbeat_at"] is not None and after["worker"] == "w-test"
        assert after["started_at"] is not None
    elif name == "complete":
        assert after["lease"] == before["lease"] and after["finished_at"] is not None
        assert JobResult.objects.get(job_id=after["id"]).value == {"v": 1}
    elif name == "retry":
        assert after["attempts"] == before["attempts"] and after["lease"] == before["lease"]
        assert after["run_at"] > before["run_at"]
        assert after["errors"][-1]["message"] == "boom"
        assert after["last_error"] == "builtins.ValueError: boom"
        assert after["finished_at"] is None
    elif name == "dead":
        assert after["finished_at"] is not None and after["errors"][-1]["type"].endswith(
            "ValueError"
        )
    elif name == "release":
        assert after["attempts"] == before["attempts"] - 1, "a released attempt is not counted"
        assert after["lease"] == before["lease"] and after["errors"] == before["errors"]
    elif name == "reap":
        assert after["lease"] == before["lease"] + 1
        assert after["errors"][-1]["type"] == "django_pgjobs.exceptions.WorkerLost"
        assert "worker lost" in after["last_error"]
        assert after["errors"][-1]["worker"] == "test-worker"
    elif name == "cancel":
        assert after["lease"] == before["lease"] + 1 and after["finished_at"] is not None
    elif name == "retry_now":
        assert after["lease"] == before["lease"] + 1 and after["attempts"] == 0
        assert after["finished_at"] is None and after["errors"] == before["errors"]


def test_reap_out_of_attempts_goes_dead() -> None:
    job = make_job(JobStatus.RUNNING, attempts=3, max_attempts=3, heartbeat_age=STALE)
    # Lost workers cost no attempt until the job had its attempt given back max_attempts times.
    lost = {"type": "django_pgjobs.exceptions.WorkerLost", "refunded": True}
    Job.objects.filter(id=job.id).update(errors=[lost] * 3)
    rows = sql.reap(connection, stale_after=60)
    assert [(r[0], r[2]) for r in rows] == [(job.id, JobStatus.DEAD)]
    after = snapshot(job.id)
    assert after["status"] == JobStatus.DEAD and after["finished_at"] is not None
    assert after["lease"] == 2


def test_reap_and_retry_now_leave_fresh_running_rows_alone() -> None:
    job = make_job(JobStatus.RUNNING, heartbeat_age=1.0)
    before = snapshot(job.id)
    assert sql.reap(connection, stale_after=60) == []
    assert sql.retry_now(connection, [job.id], stale_after=60) == set()
    assert snapshot(job.id) == before


def test_claim_skips_future_run_at() -> None:
    job = make_job(JobStatus.PENDING, queue="later", run_at_delta=3600)
    before = snapshot(job.id)
    assert sql.claim(connection, worker="w", queues=["later"], n=5) == []
    assert snapshot(job.id) == before


# -- stale writes: a zombie (old lease) changes nothing ------------------------------

STALE_WRITES: dict[str, Callable[[Job, int], Any]] = {
    "heartbeat": lambda j, lease: sql.heartbeat(connection, [(j.id, lease)]) == {j.id},
    "complete": lambda j, lease: sql.complete_many(connection, [(j.id, lease, 1)]) == set(),
    "retry": lambda j, lease: (
        sql.retry(connection, id=j.id, lease=lease, delay=0, error=ERROR) is False
    ),
    "dead": lambda j, lease: sql.dead(connection, id=j.id, lease=lease, error=ERROR) is False,
    "release": lambda j, lease: sql.release(connection, id=j.id, lease=lease) is False,
}


@pytest.mark.parametrize("write", sorted(STALE_WRITES))
@pytest.mark.parametrize("status", ALL_STATUSES)
def test_stale_lease_write_changes_nothing(write: str, status: str) -> None:
    """The row was reclaimed (lease 2) or moved on; the old owner (lease 1) writes."""
    job = make_job(status, lease=2, attempts=2, idempotency_key=f"k-{write}-{status}")
    before = snapshot(job.id)
    assert STALE_WRITES[write](job, 1), f"{write} with an old lease did not report it"
    assert snapshot(job.id) == before
    assert not JobResult.objects.filter(job_id=job.id).exists()


def test_current_lease_heartbeat_refreshes_only_that_row() -> None:
    mine = make_job(JobStatus.RUNNING, heartbeat_age=10, queue="hb1")
    other = make_job(JobStatus.RUNNING, heartbeat_age=10, queue="hb2")
    other_before = snapshot(other.id)
    assert sql.heartbeat(connection, [(mine.id, mine.lease)]) == set()
    mine.refresh_from_db()
    assert snapshot(other.id) == other_before
    assert mine.heartbeat_at > other.heartbeat_at


def test_heartbeat_reports_deleted_rows_as_lost() -> None:
    job = make_job(JobStatus.RUNNING)
    Job.objects.filter(id=job.id).delete()
    assert sql.heartbeat(connection, [(job.id, job.lease)]) == {job.id}


def test_complete_many_mixes_ours_and_zombies() -> None:
    ours = make_job(JobStatus.RUNNING, lease=3, queue="m1", idempotency_key="mix-ours")
    zombie = make_job(JobStatus.RUNNING, lease=3, queue="m2")
    zombie_before = snapshot(zombie.id)
    done = sql.complete_many(connection, [(ours.id, 3, None), (zombie.id, 2, "x")])
    assert done == {ours.id}
    assert snapshot(zombie.id) == zombie_before
    # A keyed job stores a result row even for a None return (it guards re-runs).
    assert JobResult.objects.get(job_id=ours.id).idempotency_key == "mix-ours"
    assert not JobResult.objects.filter(job_id=zombie.id).exists()
