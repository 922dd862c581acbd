"""``batch()`` (docs/reference/workflows.md): jobs enqueued inside the block join; the
callbacks fire
once every member has finished and the block has closed the batch."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from django_pgjobs import batch, chain
from django_pgjobs.models import Job
from django_pgjobs.models import Workflow as WorkflowRow
from django_pgjobs.testing import run_jobs
from tests import workflow_jobs as w

pytestmark = pytest.mark.django_db


def ran(results: list[Any]) -> list[tuple[str, str, Any]]:
    return [(r.task.rsplit(".", 1)[-1], r.status, r.value) for r in results]


def callbacks() -> dict[str, str]:
    return dict(Job.objects.filter(node__startswith="on_").values_list("node", "status"))


@pytest.mark.django_db(transaction=True)  # enqueue_many's rows are due at their COPY's time
def test_members_join_and_callbacks_fire_once_with_counts() -> None:
    with batch(
        on_complete=w.summarise.s(label="all"),
        on_success=w.summarise.s(label="ok"),
        on_failure=w.summarise.s(label="bad"),
    ) as b:
        one = w.double.enqueue(1)
        assert w.double.enqueue_many([(2,), (3,)]) == 2
        named = Job.objects.enqueue(w.explode.name)
    assert b.id is not None and b.members == 4
    assert Job.objects.filter(workflow_id=b.id, waiting__isnull=True).count() == 4
    assert one.workflow_id == b.id and named.workflow_id == b.id
    assert [c.status for c in b.callbacks] == ["blocked"] * 3
    assert callbacks() == {
        "on_complete": "blocked",
        "on_success": "blocked",
        "on_failure": "blocked",
    }
    results = ran(run_jobs())
    counts = {"completed": 3, "dead": 1, "cancelled": 0}
    assert results[-2:] == [
        ("summarise", "completed", {"label": "all", **counts}),
        ("summarise", "completed", {"label": "bad", **counts}),
    ]
    assert callbacks() == {
        "on_complete": "completed",
        "on_success": "cancelled",
        "on_failure": "completed",
    }
    skipped = Job.objects.get(node="on_success")
    assert skipped.last_error == (
        f'not run: batch #{b.id} finished with {{"dead": 1, "cancelled": 0, "completed": 3}}'
    )
    row = WorkflowRow.objects.get(id=b.id)
    assert (row.completed, row.dead, row.cancelled, row.members) == (3, 1, 0, 4)
    assert row.fired_at is not None and row.closed_at is not None


def test_success_without_failures_and_si_callbacks() -> None:
    with batch(on_success=w.constant.si("done"), on_failure=w.constant.si("failed")):
        w.double.enqueue(1)
    assert ran(run_jobs()) == [("double", "completed", 2), ("constant", "completed", "done")]
    assert callbacks() == {"on_success": "completed", "on_failure": "cancelled"}


def test_callbacks_wait_for_the_block_to_close() -> None:
    """Members that finish while the block is still open do not fire the batch; the
    close does, at once, when they have all finished. The callbacks are written,
    blocked, when the block opens."""
    with batch(on_complete=w.summarise.s()) as b:
        w.double.enqueue(1)
        assert ran(run_jobs()) == [("double", "completed", 2)]
        assert callbacks() == {"on_complete": "blocked"}
        w.double.enqueue(2)
    assert callbacks() == {"on_complete": "blocked"}  # one member has not finished
    assert ran(run_jobs())[-1] == (
        "summarise",
        "completed",
        {"label": "", "completed": 2, "dead": 0, "cancelled": 0},
    )
    assert WorkflowRow.objects.get(id=b.id).members == 2


def test_an_empty_batch_fires_at_close() -> None:
    with batch(on_complete=w.summarise.s(label="empty")) as b:
        pass
    assert b.members == 0 and callbacks() == {"on_complete": "pending"}
    assert ran(run_jobs()) == [
        ("summarise", "completed", {"label": "empty", "completed": 0, "dead": 0, "cancelled": 0})
    ]


def test_rollback_removes_batch_and_members() -> None:
    with transaction.atomic():
        with batch(on_complete=w.summarise.s()):
            w.double.enqueue(1)
        transaction.set_rollback(True)
    assert not Job.objects.exists() and not WorkflowRow.objects.exists()


def test_an_exception_in_the_block_still_closes_the_batch() -> None:
    with pytest.raises(RuntimeError, match="halfway"), batch(on_complete=w.summarise.s()) as b:
        w.double.enqueue(1)
        raise RuntimeError("halfway")
    assert b.members == 1
    assert ran(run_jobs())[-1][0] == "summarise"


def test_a_broken_transaction_is_left_to_roll_back() -> None:
    with (
        pytest.raises(IntegrityError),
        transaction.atomic(),
        batch(on_complete=w.summarise.s()) as b,
    ):
        w.double.enqueue(1)
        Job.objects.create(task="x", priority=500)  # violates a CHECK: the transaction breaks
    assert b.members is None
    assert not Job.objects.exists() and not WorkflowRow.objects.exists()


def test_nested_batches_join_the_innermost_and_workflows_do_not_join() -> None:
    with batch(on_complete=w.summarise.s(label="outer")) as outer:
        w.double.enqueue(1)
        with batch(on_complete=w.summarise.s(label="inner")) as inner:
            w.double.enqueue(2)
        run = chain(w.double.s(3), w.double.s()).enqueue()
        w.double.enqueue(4)
    assert (outer.members, inner.members) == (2, 1)
    assert {j.workflow_id for j in run.jobs} == {run.id}
    assert run.id not in (outer.id, inner.id)
    labels = sorted(r.value["label"] for r in run_jobs() if r.task == w.summarise.name)
    assert labels == ["inner", "outer"]


def test_an_existing_key_returns_the_existing_job_which_does_not_join() -> None:
    before = w.double.using(idempotency_key="b-key").enqueue(1)
    with batch(on_complete=w.summarise.s()) as b:
        again = w.double.using(idempotency_key="b-key").enqueue(1)
    assert again.id == before.id and again.workflow_id is None
    assert b.members == 0


def test_retrying_a_dead_member_after_the_batch_fired_keeps_counts_true() -> None:
    with batch(on_failure=w.summarise.s()) as b:
        dead = w.explode.enqueue()
    assert ran(run_jobs())[-1] == (
        "summarise",
        "completed",
        {"label": "", "completed": 0, "dead": 1, "cancelled": 0},
    )
    Job.objects.filter(id=dead.id).retry()
    row = WorkflowRow.objects.get(id=b.id)
    assert (row.dead, row.completed) == (0, 0)
    run_jobs()
    row.refresh_from_db()
    assert row.dead == 1
    assert Job.objects.filter(task=w.summarise.name).count() == 1, "fired once, not again"


def test_cancelling_the_batch_cancels_members_and_callbacks() -> None:
    from django_pgjobs.workflows import cancel_workflow

    with batch(on_complete=w.summarise.s()) as b:
        w.double.enqueue(1)
        w.double.enqueue(2)
    assert b.id is not None and cancel_workflow(b.id) == 3
    assert run_jobs() == []
    row = WorkflowRow.objects.get(id=b.id)
    assert (row.cancelled, row.cancelled_at is not None) == (2, True)


def test_batch_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match=r"batch\(on_complete=...\) must be a signature"):
        batch(on_complete=w.summarise)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"on_success=.*missing a required argument: 'x'"):
        batch(on_success=w.double.si())
    with pytest.raises(TypeError, match=r"on_failure=.*too many positional arguments"):
        batch(on_failure=w.double.s(1))  # the counts come first
    b = batch()
    with b:
        pass
    with pytest.raises(RuntimeError, match="was used already"), b:
        pass
    assert WorkflowRow.objects.count() == 1
