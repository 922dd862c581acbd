"""Every state transition, driven from ``states.ALLOWED_TRANSITIONS``.

Each operation of ``django_pgjobs/db/`` is applied to a row in every status: where
the state machine allows the move, the row moves (and only as described);
everywhere else, and for every write carrying a stale lease, the row is left exactly
as it was. The moves each statement declares (``db/moves.py``) are held to the table
both ways, and the schema page's diagram is the table's.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgjobs import claim, db
from django_pgjobs.claim.plain import CLAIM_STATEMENTS
from django_pgjobs.db.durable import job_park, job_wake_due, job_wake_now
from django_pgjobs.db.job_admin import job_cancel, job_retry_now
from django_pgjobs.db.job_outcome import (
    job_complete_many,
    job_dead,
    job_dead_exhausted,
    job_heartbeat,
    job_release,
    job_release_many,
    job_retry,
)
from django_pgjobs.db.moves import MOVES
from django_pgjobs.db.reap import job_reap_stale
from django_pgjobs.db.workers import JOB_DEAD_UNKNOWN
from django_pgjobs.models import Job, JobResult, Worker
from django_pgjobs.states import ALLOWED_TRANSITIONS, JobStatus, can_move, state_diagram
from django_pgjobs.workflows.runs import cancel_workflow
from tests.helpers.rows import make_job, snapshot

pytestmark = pytest.mark.django_db

ERROR = {"attempt": 1, "type": "builtins.ValueError", "message": "boom", "traceback": "tb"}
STALE = 3600.0  # heartbeat age used for "stuck" rows (far beyond STALE_AFTER)
SCHEMA_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "schema.md"


@dataclass(frozen=True)
class Op:
    """One operation of ``django_pgjobs/db/``: the statements it runs, where it may
    start, where it leads."""

    name: str
    statements: tuple[str, ...]  # the db/ constants it runs (their declared moves)
    apply: Callable[[Job], Any]
    moves: dict[str, str]  # from status -> to status (a running row must be stale for some)
    needs_stale: bool = False
    row: dict[str, Any] = field(default_factory=dict)  # make_job options of the test rows
    #: puts the row in the workflow the operation acts through (before the snapshot)
    prepare: Callable[[Job], Any] | None = None
    #: counters the operation may change on a row it does not move (bookkeeping)
    counts: frozenset[str] = frozenset()


# Workflows: a job moves when a parent of it moves (the trigger of
# db/workflow_trigger.py), or when it is retried with parents still unfinished.
_PARENTS: dict[int, Job] = {}


def _with_parent(parent_status: str) -> Callable[[Job], Any]:
    def prepare(job: Job) -> None:
        parent = make_job(parent_status, queue=f"{job.queue}-parent")
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO django_pgjobs_jobdependency"
                " (child_id, position, parent_id, on_parent_failure, receives)"
                " VALUES (%s, 0, %s, 'cancel', 'none')",
                [job.id, parent.id],
            )
        failed = parent_status != JobStatus.RUNNING
        Job.objects.filter(id__in=[job.id, parent.id]).update(workflow_id=1)
        Job.objects.filter(id=job.id).update(
            failed_parents=int(failed),
            cancelled_by=parent.id if failed and job.status == JobStatus.CANCELLED else None,
            waiting=1 if job.status == JobStatus.BLOCKED else 0,
        )
        _PARENTS[job.id] = parent

    return prepare


def _waiting_one(job: Job) -> None:
    """A workflow job retried while one of its parents has not finished."""
    if job.status in (JobStatus.DEAD, JobStatus.CANCELLED, JobStatus.BLOCKED):
        Job.objects.filter(id=job.id).update(waiting=1, failed_parents=0)


def _in_workflow(job: Job) -> None:
    Job.objects.filter(id=job.id).update(workflow_id=job.id)


def _claim(job: Job) -> Any:
    return claim.claim(connection, worker="w-test", queues=[job.queue], n=1)


def _dead_unknown(job: Job) -> Any:
    """The unknown-task sweep, its conditions met: a live worker up for longer than the
    timeout, and no worker has known the job's task (no KnownTask row)."""
    long_ago = timezone.now() - timedelta(hours=1)
    Worker.objects.create(id="w-old", host="h", pid=1, concurrency=1, started_at=long_ago)
    with connection.cursor() as cursor:
        cursor.execute(
            JOB_DEAD_UNKNOWN,
            {
                "timeout": 60,
                "stale_after": 60,
                "batch": 10,
                "type": "x.UnknownTask",
                "message": "%L",
            },
        )


OPS = [
    Op("claim", CLAIM_STATEMENTS, _claim, {JobStatus.PENDING: JobStatus.RUNNING}),
    Op(
        "complete",
        ("JOB_COMPLETE_MANY_REDO",),
        lambda j: job_complete_many(connection, [(j.id, j.lease, {"v": 1})]),
        {JobStatus.RUNNING: JobStatus.COMPLETED},
    ),
    Op(
        "retry",
        ("JOB_RETRY",),
        lambda j: job_retry(connection, id=j.id, lease=j.lease, delay=60, error=ERROR),
        {JobStatus.RUNNING: JobStatus.PENDING},
    ),
    Op(
        "dead",
        ("JOB_DEAD",),
        lambda j: job_dead(connection, id=j.id, lease=j.lease, error=ERROR),
        {JobStatus.RUNNING: JobStatus.DEAD},
    ),
    Op(
        "release",
        ("JOB_RELEASE",),
        lambda j: job_release(connection, id=j.id, lease=j.lease),
        {JobStatus.RUNNING: JobStatus.PENDING},
    ),
    Op(
        "release_many",
        ("JOB_RELEASE_MANY",),
        lambda j: job_release_many(connection, [(j.id, j.lease)]),
        {JobStatus.RUNNING: JobStatus.PENDING},
    ),
    Op(
        "reap",
        ("JOB_REAP_STALE",),
        lambda j: job_reap_stale(connection, stale_after=60),
        {JobStatus.RUNNING: JobStatus.PENDING},
        needs_stale=True,
    ),
    Op(
        "cancel",
        ("JOB_CANCEL",),
        lambda j: job_cancel(connection, [j.id]),
        {
            JobStatus.BLOCKED: JobStatus.CANCELLED,
            JobStatus.WAITING: JobStatus.CANCELLED,
            JobStatus.PENDING: JobStatus.CANCELLED,
            JobStatus.RUNNING: JobStatus.CANCELLED,
        },
    ),
    Op(
        "retry_now",
        ("JOB_RETRY_NOW",),
        lambda j: job_retry_now(connection, [j.id], stale_after=60),
        {
            JobStatus.DEAD: JobStatus.PENDING,
            JobStatus.CANCELLED: JobStatus.PENDING,
            JobStatus.RUNNING: JobStatus.PENDING,
        },
        needs_stale=True,
    ),
    Op(
        "retry_now_waiting",
        ("JOB_RETRY_NOW",),
        lambda j: job_retry_now(connection, [j.id], stale_after=60),
        {
            JobStatus.DEAD: JobStatus.BLOCKED,
            JobStatus.CANCELLED: JobStatus.BLOCKED,
            JobStatus.RUNNING: JobStatus.PENDING,
        },
        needs_stale=True,
        prepare=_waiting_one,
    ),
    Op(
        "parent_completes",
        ("WORKFLOW_FUNCTIONS",),
        lambda j: job_complete_many(connection, [(_PARENTS[j.id].id, 1, None)]),
        {JobStatus.BLOCKED: JobStatus.PENDING},
        prepare=_with_parent(JobStatus.RUNNING),
        counts=frozenset({"waiting"}),
    ),
    Op(
        "parent_dies",
        ("WORKFLOW_FUNCTIONS",),
        lambda j: job_dead(connection, id=_PARENTS[j.id].id, lease=1, error=ERROR),
        {JobStatus.BLOCKED: JobStatus.CANCELLED},
        prepare=_with_parent(JobStatus.RUNNING),
        counts=frozenset({"waiting", "failed_parents"}),
    ),
    Op(
        "parent_retried",
        ("WORKFLOW_FUNCTIONS",),
        lambda j: job_retry_now(connection, [_PARENTS[j.id].id], stale_after=60),
        {JobStatus.CANCELLED: JobStatus.BLOCKED, JobStatus.PENDING: JobStatus.BLOCKED},
        prepare=_with_parent(JobStatus.DEAD),
        counts=frozenset({"waiting", "failed_parents"}),
    ),
    Op(
        "cancel_workflow",
        ("WF_CANCEL",),
        lambda j: cancel_workflow(j.id),
        {
            JobStatus.BLOCKED: JobStatus.CANCELLED,
            JobStatus.WAITING: JobStatus.CANCELLED,
            JobStatus.PENDING: JobStatus.CANCELLED,
            JobStatus.RUNNING: JobStatus.CANCELLED,
        },
        prepare=_in_workflow,
    ),
    # Durable jobs: a run parks (or, woken meanwhile, goes back to pending), and the
    # wake pass moves a waiting job whose time came.
    Op(
        "park",
        ("JOB_PARK",),
        lambda j: job_park(
            connection, id=j.id, lease=j.lease, until=None, waiting_for="{}", seen=0
        ),
        {JobStatus.RUNNING: JobStatus.WAITING},
    ),
    Op(
        "park_woken",
        ("JOB_PARK",),
        lambda j: job_park(
            connection, id=j.id, lease=j.lease, until=None, waiting_for="{}", seen=-1
        ),
        {JobStatus.RUNNING: JobStatus.PENDING},
    ),
    Op(
        "wake_due",
        ("JOB_WAKE_DUE",),
        lambda j: job_wake_due(connection),
        {JobStatus.WAITING: JobStatus.PENDING},
        counts=frozenset({"wakes"}),
    ),
    Op(
        "wake_now",
        ("JOB_WAKE_NOW",),
        lambda j: job_wake_now(connection, [j.id]),
        {JobStatus.WAITING: JobStatus.PENDING},
        counts=frozenset({"wakes"}),
    ),
    Op(
        "dead_exhausted",
        ("JOB_DEAD_EXHAUSTED",),
        lambda j: job_dead_exhausted(connection, worker="w-test"),
        {JobStatus.PENDING: JobStatus.DEAD},
        row={"attempts": 5, "max_attempts": 5},
    ),
    Op(
        "dead_unknown",
        ("JOB_DEAD_UNKNOWN",),
        _dead_unknown,
        {JobStatus.PENDING: JobStatus.DEAD},
        row={"run_at_delta": -3600.0},
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


def _statement_modules() -> list[Any]:
    """The modules that hold statements: every module of db/ and claim/."""
    return [
        importlib.import_module(info.name)
        for package in (db, claim)
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + ".")
    ]


def _declared_moves() -> dict[str, tuple[tuple[str, str], ...]]:
    """Every module of db/ and claim/ imported, so each has declared its statements' moves."""
    _statement_modules()
    return MOVES


def test_every_declared_move_is_allowed_and_every_allowed_move_has_a_statement() -> None:
    declared = _declared_moves()
    undeclared = {
        name
        for name in declared
        if name not in CLAIM_STATEMENTS
        and not any(hasattr(module, name) for module in _statement_modules())
    }
    assert not undeclared, f"moves declared for statements that do not exist: {undeclared}"
    not_allowed = {
        (name, move) for name, moves in declared.items() for move in moves
        if move not in ALLOWED_TRANSITIONS
    }  # fmt: skip
    assert not not_allowed, (
        f"statements declare moves states.ALLOWED_TRANSITIONS lacks: {not_allowed}"
    )
    made = {move for moves in declared.values() for move in moves}
    assert made == set(ALLOWED_TRANSITIONS), (
        f"allowed moves no statement declares: {set(ALLOWED_TRANSITIONS) - made}"
    )


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_each_operation_moves_only_as_its_statements_declare(op: Op) -> None:
    declared = _declared_moves()
    for name in op.statements:
        assert name in declared, f"{name} declares no moves"
        assert set(op.moves.items()) <= set(declared[name]), name


def test_the_schema_page_shows_the_state_diagram_of_the_table() -> None:
    """docs/reference/schema.md's Mermaid diagram is ``states.state_diagram()``. To
    regenerate: PGJOBS_WRITE_DIAGRAM=1 scripts/dev test tests/db/test_transitions.py -k diagram"""
    text = SCHEMA_PAGE.read_text()
    start = text.index("```mermaid\n") + len("```mermaid\n")
    end = text.index("```", start)
    if os.environ.get("PGJOBS_WRITE_DIAGRAM") == "1":
        text = text[:start] + state_diagram() + text[end:]
        SCHEMA_PAGE.write_text(text)
    assert text[start:end] == state_diagram(), (
        "docs/reference/schema.md's state diagram is not states.ALLOWED_TRANSITIONS; "
        "regenerate it: PGJOBS_WRITE_DIAGRAM=1 scripts/dev test tests/db/test_transitions.py -k diagram"
    )


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("status", ALL_STATUSES)
def test_operation_from_every_status(op: Op, status: str) -> None:
    job = make_job(
        status,
        queue=_queue(op, status),
        heartbeat_age=STALE if op.needs_stale else 0.0,
        **op.row,
    )
    if op.prepare is not None:
        op.prepare(job)
    before = snapshot(job.id)
    op.apply(job)
    after = snapshot(job.id)
    if status not in op.moves:
        kept = {k: v for k, v in after.items() if k not in op.counts}
        assert kept == {k: v for k, v in before.items() if k not in op.counts}, (
            f"{op.name} changed a {status} row"
        )
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
    elif name in ("retry_now", "retry_now_waiting"):
        assert after["lease"] == before["lease"] + 1 and after["attempts"] == 0
        assert after["finished_at"] is None and after["errors"] == before["errors"]
        assert after["cancelled_by"] is None
    elif name == "parent_completes":
        assert after["waiting"] == 0 and after["run_at"] >= before["run_at"]
        assert after["lease"] == before["lease"] and after["attempts"] == before["attempts"]
    elif name == "parent_dies":
        assert after["waiting"] == 0 and after["failed_parents"] == 1
        assert after["cancelled_by"] == _PARENTS[after["id"]].id
        assert "ended dead" in after["last_error"] and after["finished_at"] is not None
    elif name == "parent_retried":
        assert after["waiting"] == before["waiting"] + 1 and after["failed_parents"] == 0
        assert after["cancelled_by"] is None and after["finished_at"] is None
    elif name == "cancel_workflow":
        assert after["lease"] == before["lease"] + 1 and after["finished_at"] is not None
        assert after["last_error"] == "cancelled with its workflow"
    elif name == "dead_exhausted":
        assert after["lease"] == before["lease"] + 1 and after["finished_at"] is not None
        assert after["errors"][-1]["type"] == "django_pgjobs.exceptions.PgJobsError"
        assert after["errors"][-1]["worker"] == "w-test"
    elif name == "dead_unknown":
        assert after["lease"] == before["lease"] + 1 and after["finished_at"] is not None
        assert after["errors"][-1]["type"] == "x.UnknownTask"
        assert after["last_error"] == "x.UnknownTask: 'tests.testapp.jobs.add'"


def test_reap_out_of_attempts_goes_dead() -> None:
    job = make_job(JobStatus.RUNNING, attempts=3, max_attempts=3, heartbeat_age=STALE)
    # Lost workers cost no attempt until the job had its attempt given back max_attempts
    # times while it ran alone (a suspect: tests/process/test_suspects.py).
    lost = {"type": "django_pgjobs.exceptions.WorkerLost", "refunded": True, "isolated": True}
    Job.objects.filter(id=job.id).update(errors=[lost] * 3, suspect=True)
    rows = job_reap_stale(connection, stale_after=60)
    assert [(r[0], r[2]) for r in rows] == [(job.id, JobStatus.DEAD)]
    after = snapshot(job.id)
    assert after["status"] == JobStatus.DEAD and after["finished_at"] is not None
    assert after["lease"] == 2


def test_reap_and_retry_now_leave_fresh_running_rows_alone() -> None:
    job = make_job(JobStatus.RUNNING, heartbeat_age=1.0)
    before = snapshot(job.id)
    assert job_reap_stale(connection, stale_after=60) == []
    assert job_retry_now(connection, [job.id], stale_after=60).changed == set()
    assert snapshot(job.id) == before


def test_claim_skips_future_run_at() -> None:
    job = make_job(JobStatus.PENDING, queue="later", run_at_delta=3600)
    before = snapshot(job.id)
    assert claim.claim(connection, worker="w", queues=["later"], n=5) == []
    assert snapshot(job.id) == before


# -- stale writes: a zombie (old lease) changes nothing ------------------------------

STALE_WRITES: dict[str, Callable[[Job, int], Any]] = {
    "heartbeat": lambda j, lease: job_heartbeat(connection, [(j.id, lease)]) == {j.id},
    "complete": lambda j, lease: job_complete_many(connection, [(j.id, lease, 1)]) == set(),
    "retry": lambda j, lease: (
        job_retry(connection, id=j.id, lease=lease, delay=0, error=ERROR) is None
    ),
    "dead": lambda j, lease: job_dead(connection, id=j.id, lease=lease, error=ERROR) is False,
    "release": lambda j, lease: job_release(connection, id=j.id, lease=lease) is False,
    "release_many": lambda j, lease: job_release_many(connection, [(j.id, lease)]) == set(),
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
    assert job_heartbeat(connection, [(mine.id, mine.lease)]) == set()
    mine.refresh_from_db()
    assert snapshot(other.id) == other_before
    assert mine.heartbeat_at > other.heartbeat_at


def test_heartbeat_reports_deleted_rows_as_lost() -> None:
    job = make_job(JobStatus.RUNNING)
    Job.objects.filter(id=job.id).delete()
    assert job_heartbeat(connection, [(job.id, job.lease)]) == {job.id}


def test_release_many_hands_back_ours_uncounted_and_leaves_a_zombies_row() -> None:
    ours = [make_job(JobStatus.RUNNING, lease=3, attempts=2, queue=f"r{i}") for i in range(3)]
    moved_on = make_job(JobStatus.RUNNING, lease=4, attempts=3, queue="r-other")
    before = snapshot(moved_on.id)
    told = [(j.id, 3) for j in ours] + [(moved_on.id, 3)]
    assert job_release_many(connection, told) == {j.id for j in ours}
    for job in ours:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.lease, job.finished_at) == ("pending", 1, 3, None)
    assert snapshot(moved_on.id) == before


def test_complete_many_mixes_ours_and_zombies() -> None:
    ours = make_job(JobStatus.RUNNING, lease=3, queue="m1", idempotency_key="mix-ours")
    zombie = make_job(JobStatus.RUNNING, lease=3, queue="m2")
    zombie_before = snapshot(zombie.id)
    done = job_complete_many(connection, [(ours.id, 3, None), (zombie.id, 2, "x")])
    assert done == {ours.id}
    assert snapshot(zombie.id) == zombie_before
    # A keyed job stores a result row even for a None return (it guards re-runs).
    assert JobResult.objects.get(job_id=ours.id).idempotency_key == "mix-ours"
    assert not JobResult.objects.filter(job_id=zombie.id).exists()
