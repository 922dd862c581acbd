"""Outcome writes redone after a lost reply recognise their own committed write
(by the unique error entry), even once the lease has moved on; ``run_jobs``
redoes a write whose reply was lost; a retry the attempts guard dead-letters is
reported as dead-lettered.

In-process, on the real database; a lost reply is injected with Django's own
``connection.execute_wrapper`` (the statement commits, then the client gets a
connection error), as in tests/db/test_worker_core.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from django_pgjobs import claim, signals
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.job_outcome import (
    JOB_COMPLETE_MANY_REDO,
    JOB_RETRY,
    JOB_TIMED_OUT,
    job_dead,
    job_retry,
    job_timed_out,
)
from django_pgjobs.exceptions import PgJobsError
from django_pgjobs.models import Job
from django_pgjobs.support.error_entries import error_entry
from django_pgjobs.testing import run_jobs
from django_pgjobs.worker import outcomes
from django_pgjobs.worker.outcomes import Outcome
from tests.helpers.lost_replies import lose_first_reply
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

NAMES = ("succeeded", "fenced", "failed", "dead", "timed_out")


@pytest.fixture
def received() -> Iterator[dict[str, list[dict[str, Any]]]]:
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in NAMES}
    receivers: list[Callable[..., None]] = []
    for name in NAMES:

        def receiver(name: str = name, **kwargs: Any) -> None:
            got[name].append(kwargs)

        receivers.append(receiver)
        getattr(signals, f"job_{name}").connect(receiver, weak=False)
    yield got
    for name, receiver in zip(NAMES, receivers, strict=True):
        getattr(signals, f"job_{name}").disconnect(receiver)


def always_lose(statement: str) -> Callable[..., Any]:
    """Every run of ``statement`` commits, then loses its reply."""

    def wrapper(
        execute: Callable[..., Any], sql_text: str, params: Any, many: bool, context: Any
    ) -> Any:
        result = execute(sql_text, params, many, context)
        if sql_text == statement:
            raise OperationalError("server closed the connection before replying")
        return result

    return wrapper


def _failed(claimed: Claimed, kind: str = "retry", **extra: Any) -> Outcome:
    exc = ValueError("boom")
    return Outcome(
        kind, error=error_entry(claimed.attempt, exc, "w1"), delay=0.0, exception=exc, extra=extra
    )


def test_a_retry_redone_after_the_job_was_claimed_again_is_recognised(
    received: dict[str, list[dict[str, Any]]],
) -> None:
    job = jobs.always_fails.using(max_attempts=3).enqueue()
    [first] = claim.claim(connection, worker="w1", queues=None, n=1)
    outcome = _failed(first)
    with (
        connection.execute_wrapper(lose_first_reply(JOB_RETRY)),
        pytest.raises(OperationalError),
    ):
        outcomes.write(connection, first, outcome)
    # The write committed: the job is due again and another worker claims it.
    [second] = claim.claim(connection, worker="w2", queues=None, n=1)
    assert second.id == job.id and second.lease != first.lease
    # The redo recognises its own entry: ours, not fenced, and it changes nothing.
    assert outcomes.write(connection, first, outcome) is True
    outcomes.report(first, outcome, ours=True, worker="w1")
    assert received["fenced"] == []
    assert [r["job_id"] for r in received["failed"]] == [job.id]
    row = Job.objects.get(id=job.id)
    assert row.status == "running" and row.lease == second.lease and len(row.errors) == 1
    # A different write under the old lease is still fenced.
    assert (
        job_retry(
            connection,
            id=job.id,
            lease=first.lease,
            delay=0,
            error=error_entry(first.attempt, ValueError("x"), "w1"),
        )
        is None
    )
    assert not job_dead(
        connection,
        id=job.id,
        lease=first.lease,
        error=error_entry(first.attempt, ValueError("y"), "w1"),
    )


def test_a_timed_out_write_redone_after_a_lost_reply_is_recognised() -> None:
    job = jobs.noop.using(max_attempts=2).enqueue()
    [claimed] = claim.claim(connection, worker="w1", queues=None, n=1)
    error = error_entry(claimed.attempt, TimeoutError("too slow"), "w1")
    with (
        connection.execute_wrapper(lose_first_reply(JOB_TIMED_OUT)),
        pytest.raises(OperationalError),
    ):
        job_timed_out(
            connection, id=claimed.id, lease=claimed.lease, retry=True, delay=60, error=error
        )
    row = Job.objects.get(id=job.id)
    assert row.status == "pending" and row.lease == claimed.lease + 1
    # The lease was bumped by our own write: the redo still says what it did.
    assert (
        job_timed_out(
            connection, id=claimed.id, lease=claimed.lease, retry=True, delay=60, error=error
        )
        == "pending"
    )
    assert len(Job.objects.get(id=job.id).errors) == 1
    # The last attempt with retry=False: dead, and the redo says dead.
    Job.objects.filter(id=job.id).update(run_at=row.created_at)
    [again] = claim.claim(connection, worker="w1", queues=None, n=1)
    last = error_entry(again.attempt, TimeoutError("too slow"), "w1")
    for _ in range(2):
        assert (
            job_timed_out(
                connection, id=again.id, lease=again.lease, retry=True, delay=0, error=last
            )
            == "dead"
        )
    # Someone else's (or another) write under that lease is fenced.
    assert (
        job_timed_out(
            connection,
            id=again.id,
            lease=again.lease,
            retry=True,
            delay=0,
            error=error_entry(again.attempt, TimeoutError("x"), "w1"),
        )
        is None
    )


def test_run_jobs_redoes_a_completion_whose_reply_was_lost(
    received: dict[str, list[dict[str, Any]]],
) -> None:
    job = jobs.add.enqueue(2, 3)
    with connection.execute_wrapper(lose_first_reply(JOB_COMPLETE_MANY_REDO)):
        ran = run_jobs()
    assert [(r.id, r.status, r.value) for r in ran] == [(job.id, "completed", 5)]
    assert [r["job_id"] for r in received["succeeded"]] == [job.id]
    assert received["fenced"] == []
    assert Job.objects.get(id=job.id).status == "completed"


def test_run_jobs_raises_a_clear_error_when_the_redo_fails_too(
    received: dict[str, list[dict[str, Any]]],
) -> None:
    job = jobs.add.enqueue(2, 3)
    with (
        connection.execute_wrapper(always_lose(JOB_COMPLETE_MANY_REDO)),
        pytest.raises(PgJobsError, match=rf"completed outcome of job {job.id} .*redo"),
    ):
        run_jobs()
    assert received["succeeded"] == [] and received["fenced"] == []


def test_run_jobs_inside_a_transaction_cannot_redo_and_says_so() -> None:
    job = jobs.add.enqueue(2, 3)
    with (
        pytest.raises(PgJobsError, match=rf"job {job.id} .*inside a transaction"),
        transaction.atomic(),
        connection.execute_wrapper(lose_first_reply(JOB_COMPLETE_MANY_REDO)),
    ):
        run_jobs()


def test_a_retry_the_attempts_guard_dead_letters_is_reported_as_dead(
    received: dict[str, list[dict[str, Any]]],
) -> None:
    job = jobs.always_fails.using(max_attempts=3).enqueue()
    [claimed] = claim.claim(connection, worker="w1", queues=None, n=1)
    Job.objects.filter(id=job.id).update(max_attempts=1)  # lowered while it ran
    outcome = _failed(claimed)
    assert outcomes.write(connection, claimed, outcome) is True
    assert outcome.kind == "dead"
    outcomes.report(claimed, outcome, ours=True, worker="w1")
    assert [r["job_id"] for r in received["dead"]] == [job.id]
    assert received["failed"] == [] and received["fenced"] == []
    assert Job.objects.get(id=job.id).status == "dead"
    # The redo of that write (reply lost) reports dead too.
    assert (
        job_retry(connection, id=job.id, lease=claimed.lease, delay=0, error=outcome.error or {})
        == "dead"
    )
