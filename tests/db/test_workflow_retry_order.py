"""Retrying workflow nodes in any order: a retried node whose parents have not all
finished is blocked, whatever statements or chunks came before, and waits for them;
a retried parent puts back to blocked the children that were released (and not yet
claimed) while it was failed. Each then runs once, with the parent's real result.

docs/howto/compose-jobs.md ("Retry a failed node") states the guarantee.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from django_pgjobs import Workflow
from django_pgjobs.db.job_admin import job_retry_now
from django_pgjobs.jobs import operations
from django_pgjobs.models import Job, JobResult
from django_pgjobs.testing import run_jobs
from tests import workflow_jobs as w
from tests.conftest import dsn, wait_until

Retry = Callable[[list[int]], Any]


def _state(job_id: int) -> tuple[str, int | None, int | None]:
    job = Job.objects.get(id=job_id)
    return job.status, job.waiting, job.failed_parents


def _failed_pair(flag: Path, on_parent_failure: str = "run") -> tuple[int, int]:
    """``a`` died; its child ``b`` ran without its result and died too (``"run"``),
    or was cancelled by it (``"cancel"``). ``a`` completes once ``flag`` exists."""
    wf = Workflow("retry order")
    a = wf.add(w.dies_until.s(str(flag), 21), name="a")
    wf.add(w.needs_parents.s(), after=[a], name="b", on_parent_failure=on_parent_failure)
    a_id, b_id = (job.id for job in wf.enqueue().jobs)
    run_jobs()
    second = "dead" if on_parent_failure == "run" else "cancelled"
    assert [Job.objects.get(id=i).status for i in (a_id, b_id)] == ["dead", second]
    flag.touch()
    return a_id, b_id


def _runs_once_with_the_result(a_id: int, b_id: int) -> None:
    ran = [(r.id, r.status) for r in run_jobs()]
    assert ran == [(a_id, "completed"), (b_id, "completed")]
    assert JobResult.objects.get(job_id=b_id).value == {"a": 21}
    assert Job.objects.get(id=b_id).attempts == 1


def _queryset(ids: list[int]) -> None:
    Job.objects.filter(id__in=ids).retry()


def _command(ids: list[int]) -> None:
    call_command("retry_jobs", "--ids", ",".join(map(str, ids)), "--status", "dead,cancelled")


@pytest.fixture
def admin_retry(admin_client: Client) -> Retry:
    def retry(ids: list[int]) -> None:
        response = admin_client.post(
            reverse("admin:django_pgjobs_job_changelist"),
            {"action": "retry_now", "_selected_action": ids},
        )
        assert response.status_code == 302

    return retry


@pytest.fixture(params=["queryset", "admin", "retry_jobs"])
def retry(request: Any) -> Retry:
    if request.param == "admin":
        fixture: Retry = request.getfixturevalue("admin_retry")
        return fixture
    return _queryset if request.param == "queryset" else _command


@pytest.mark.django_db
def test_a_child_retried_after_its_retried_parent_waits_for_it(
    retry: Retry, tmp_path: Path
) -> None:
    """Two statements, the parent's first: the child goes back to blocked, counting
    the parent, rather than going pending and running with ``{"a": None}``."""
    a_id, b_id = _failed_pair(tmp_path / "ok")
    retry([a_id])
    retry([b_id])
    assert _state(a_id) == ("pending", 0, None)
    assert _state(b_id) == ("blocked", 1, 0)
    _runs_once_with_the_result(a_id, b_id)


@pytest.mark.django_db
def test_a_child_retried_before_its_parent_waits_for_it(retry: Retry, tmp_path: Path) -> None:
    """Two statements, the child's first: the parent's retry puts the child, released
    while its parent was dead and not claimed yet, back to blocked."""
    a_id, b_id = _failed_pair(tmp_path / "ok")
    retry([b_id])
    assert _state(b_id) == ("pending", 0, 1)  # a is dead: b runs without it, as "run" says
    retry([a_id])
    assert _state(b_id) == ("blocked", 1, 0)
    _runs_once_with_the_result(a_id, b_id)


@pytest.mark.django_db
def test_one_selection_in_two_chunks_keeps_the_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A selection larger than a chunk is retried one fenced statement per chunk: the
    parent in one, its child in the next."""
    monkeypatch.setattr(operations, "CHUNK", 1)
    a_id, b_id = _failed_pair(tmp_path / "ok")
    assert operations.retry(Job.objects.filter(id__in=[a_id, b_id])).changed == {a_id, b_id}
    assert _state(b_id) == ("blocked", 1, 0)
    _runs_once_with_the_result(a_id, b_id)


@pytest.mark.django_db
@pytest.mark.parametrize("on_parent_failure", ["run", "cancel"])
def test_parent_and_child_in_one_statement(on_parent_failure: str, tmp_path: Path) -> None:
    a_id, b_id = _failed_pair(tmp_path / "ok", on_parent_failure)
    assert Job.objects.filter(id__in=[a_id, b_id]).retry() == 2
    assert _state(b_id) == ("blocked", 1, 0)
    _runs_once_with_the_result(a_id, b_id)


# -- the parent's state at retry time ---------------------------------------------------


def _child_of(parent_status: str, on_parent_failure: str) -> tuple[int, int]:
    """A dead child ``b`` of a parent ``a`` now ``parent_status`` (set by hand)."""
    wf = Workflow("parent state")
    a = wf.add(w.double.s(1), name="a")
    wf.add(w.report_parents.s(), after=[a], on_parent_failure=on_parent_failure)
    a_id, b_id = (job.id for job in wf.enqueue().jobs)
    Job.objects.filter(id=b_id).update(status="dead", waiting=0, finished_at=Now())
    finished = Now() if parent_status in ("completed", "dead", "cancelled") else None
    waiting = 1 if parent_status == "blocked" else 0  # as if it had a parent of its own
    Job.objects.filter(id=a_id).update(status=parent_status, finished_at=finished, waiting=waiting)
    return a_id, b_id


@pytest.mark.django_db
@pytest.mark.parametrize("on_parent_failure", ["run", "cancel"])
@pytest.mark.parametrize(
    ("parent_status", "expected"),
    [
        ("blocked", ("blocked", 1, 0)),
        ("pending", ("blocked", 1, 0)),
        ("running", ("blocked", 1, 0)),
        ("completed", ("pending", 0, 0)),
        # finished without a result: the child runs without it (the operator asked)
        ("dead", ("pending", 0, 1)),
        ("cancelled", ("pending", 0, 1)),
    ],
)
def test_a_retried_child_counts_its_parents_at_retry_time(
    parent_status: str, expected: tuple[str, int, int], on_parent_failure: str
) -> None:
    _, b_id = _child_of(parent_status, on_parent_failure)
    assert Job.objects.filter(id=b_id).retry() == 1
    assert _state(b_id) == expected


@pytest.mark.django_db
def test_a_pruned_parent_counts_as_finished() -> None:
    a_id, b_id = _child_of("completed", "cancel")
    Job.objects.filter(id=a_id).delete()
    assert Job.objects.filter(id=b_id).retry() == 1
    assert _state(b_id) == ("pending", 0, 0)


@pytest.mark.django_db
def test_a_child_already_running_or_finished_is_left_alone(tmp_path: Path) -> None:
    """A retried parent re-blocks only children not claimed yet: one that ran keeps
    what it did."""
    wf = Workflow("ran already")
    a = wf.add(w.dies_until.s(str(tmp_path / "ok"), 21), name="a")
    wf.add(w.report_parents.s(), after=[a], on_parent_failure="run")
    wf.add(w.report_parents.s(), after=[a], on_parent_failure="run")
    a_id, done_id, running_id = (job.id for job in wf.enqueue().jobs)
    run_jobs(max_jobs=2)
    Job.objects.filter(id=running_id).update(status="running")
    assert [_state(i)[0] for i in (a_id, done_id)] == ["dead", "completed"]
    Job.objects.filter(id=a_id).retry()
    assert [_state(i)[0] for i in (done_id, running_id)] == ["completed", "running"]


# -- concurrent retries and completions ---------------------------------------------------


@pytest.fixture
def third_connection(transactional_db: Any) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn(), autocommit=True) as conn:
        yield conn


def _waits_for_a_lock(conn: psycopg.Connection, pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
    ).fetchone()
    return row is not None and row[0] == "Lock"


class _Waiter(threading.Thread):
    """A statement run in a thread (it is to wait for a lock); ``finish`` joins it and
    re-raises what it raised."""

    def __init__(self, action: Callable[[], Any]):
        super().__init__()
        self.action = action
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.action()
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
            self.error = exc

    def finish(self) -> None:
        self.join(timeout=30)
        assert not self.is_alive(), "the waiting statement did not finish"
        if self.error is not None:
            raise self.error


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first", ["parent", "child"])
def test_concurrent_retries_of_a_parent_and_its_child(
    first: str,
    other_connection: psycopg.Connection,
    third_connection: psycopg.Connection,
    tmp_path: Path,
) -> None:
    """Two transactions, one retrying the parent and one the child, the first still
    open when the second starts: the second waits for it, and the child ends blocked
    on the parent whichever came first."""
    a_id, b_id = _failed_pair(tmp_path / "ok")
    ids = {"parent": [a_id], "child": [b_id]}
    second = "child" if first == "parent" else "parent"
    with other_connection.transaction():
        job_retry_now(other_connection, ids[first], stale_after=60)
        pid = third_connection.info.backend_pid
        waiter = _Waiter(lambda: job_retry_now(third_connection, ids[second], stale_after=60))
        wait_until(
            lambda: _waits_for_a_lock(other_connection, pid),
            timeout=10,
            message="the second retry waits for the first",
        )
    waiter.finish()
    assert _state(b_id) == ("blocked", 1, 0)
    _runs_once_with_the_result(a_id, b_id)


@pytest.mark.django_db(transaction=True)
def test_a_child_retried_while_its_parent_completes(
    other_connection: psycopg.Connection, third_connection: psycopg.Connection
) -> None:
    """The parent's completion, not committed yet, when the child is retried: the
    retry waits for it and sees the parent completed, rather than reading the parent
    running and leaving the child blocked for good."""
    wf = Workflow("completing")
    a = wf.add(w.double.s(1), name="a")
    wf.add(w.report_parents.s(), after=[a], on_parent_failure="run")
    a_id, b_id = (job.id for job in wf.enqueue().jobs)
    Job.objects.filter(id=a_id).update(status="running", lease=1)
    Job.objects.filter(id=b_id).update(status="dead", waiting=0, finished_at=Now())
    with other_connection.transaction():
        other_connection.execute(
            "UPDATE django_pgjobs_job SET status = 'completed', finished_at = now() WHERE id = %s",
            [a_id],
        )
        pid = third_connection.info.backend_pid
        waiter = _Waiter(lambda: job_retry_now(third_connection, [b_id], stale_after=60))
        wait_until(
            lambda: _waits_for_a_lock(other_connection, pid),
            timeout=10,
            message="the retry waits for the completion",
        )
    waiter.finish()
    assert _state(b_id) == ("pending", 0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_parent_completing_while_its_child_is_retried(
    other_connection: psycopg.Connection, third_connection: psycopg.Connection
) -> None:
    """The other order: the child's retry, not committed yet, holds the running
    parent; its completion waits, then releases the child, once."""
    wf = Workflow("completing")
    a = wf.add(w.double.s(1), name="a")
    wf.add(w.report_parents.s(), after=[a], on_parent_failure="run")
    a_id, b_id = (job.id for job in wf.enqueue().jobs)
    Job.objects.filter(id=a_id).update(status="running", lease=1)
    Job.objects.filter(id=b_id).update(status="dead", waiting=0, finished_at=Now())
    with other_connection.transaction():
        job_retry_now(other_connection, [b_id], stale_after=60)
        pid = third_connection.info.backend_pid
        waiter = _Waiter(
            lambda: third_connection.execute(
                "UPDATE django_pgjobs_job SET status = 'completed', finished_at = now()"
                " WHERE id = %s",
                [a_id],
            ),
        )
        wait_until(
            lambda: _waits_for_a_lock(other_connection, pid),
            timeout=10,
            message="the completion waits for the retry",
        )
    waiter.finish()
    assert _state(b_id) == ("pending", 0, 0)
