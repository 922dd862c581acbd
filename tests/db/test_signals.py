"""Signals: started, succeeded, failed (retrying), dead, fenced; receivers cannot
change a job's outcome."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.dispatch import Signal

from django_pgjobs import claim, signals
from django_pgjobs.db.job_admin import job_cancel
from django_pgjobs.models import Job
from django_pgjobs.worker import outcomes
from django_pgjobs.worker.executor import execute
from django_pgjobs.worker.loop import Worker
from tests.testapp import jobs

ALL = {
    "job_started": signals.job_started,
    "job_succeeded": signals.job_succeeded,
    "job_failed": signals.job_failed,
    "job_dead": signals.job_dead,
    "job_fenced": signals.job_fenced,
    "jobs_reaped": signals.jobs_reaped,
}


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    got: list[tuple[str, dict[str, Any]]] = []
    receivers = {}
    for name, sig in ALL.items():

        def receiver(sender: Any, signal: Signal, _name: str = name, **kwargs: Any) -> None:
            got.append((_name, kwargs))

        receivers[name] = receiver
        sig.connect(receiver)
    yield got
    for name, sig in ALL.items():
        sig.disconnect(receivers[name])


@pytest.fixture
def raising() -> Iterator[None]:
    def boom(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    for sig in ALL.values():
        sig.connect(boom)
    yield
    for sig in ALL.values():
        sig.disconnect(boom)


def _burst() -> Worker:
    worker = Worker(burst=True, maintenance=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    return worker


@pytest.mark.django_db(transaction=True)
def test_worker_sends_started_succeeded_failed_and_dead(
    received: list[tuple[str, dict[str, Any]]],
) -> None:
    ok = jobs.add.enqueue(1, 2)
    failing = jobs.always_fails.enqueue("once")
    dead = jobs.always_fails.using(max_attempts=1).enqueue("final")
    worker = _burst()
    by_job: dict[int, list[str]] = {}
    for name, kwargs in received:
        by_job.setdefault(kwargs["job_id"], []).append(name)
        assert kwargs["worker"] == worker.id and kwargs["task"].startswith("tests.testapp.jobs.")
    assert by_job[ok.id] == ["job_started", "job_succeeded"]
    assert by_job[failing.id][:2] == ["job_started", "job_failed"]
    assert by_job[dead.id] == ["job_started", "job_dead"]
    succeeded = next(k for n, k in received if n == "job_succeeded")
    assert (succeeded["result"], succeeded["attempt"], succeeded["lease"]) == (3, 1, 1)
    failed = next(k for n, k in received if n == "job_failed")
    assert isinstance(failed["exception"], ValueError) and 0 <= failed["retry_in"] <= 0.05
    dead_kw = next(k for n, k in received if n == "job_dead")
    assert str(dead_kw["exception"]) == "final"


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["completed", "retry", "dead"])
def test_fenced_write_sends_job_fenced_and_changes_nothing(
    kind: str, received: list[tuple[str, dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    task = {"completed": jobs.add, "retry": jobs.always_fails, "dead": jobs.discard_me}[kind]
    job = task.enqueue(1, 2) if kind == "completed" else task.enqueue()
    Job.objects.filter(id=job.id).update(run_at=job.run_at.replace(year=2000))
    [claimed] = claim.claim(connection, worker="zombie", queues=["default"], n=1)
    outcome = execute(claimed, worker="zombie", alias="default")
    assert outcome.kind == kind
    job_cancel(connection, [job.id])  # someone else moved the lease on
    job.refresh_from_db()
    before = (job.status, job.lease, job.errors, job.finished_at)
    ours = outcomes.write(connection, claimed, outcome)
    with caplog.at_level(logging.WARNING, logger="django_pgjobs"):
        outcomes.report(claimed, outcome, ours=ours, worker="zombie")
    assert ours is False
    job.refresh_from_db()
    assert (job.status, job.lease, job.errors, job.finished_at) == before
    assert [n for n, _ in received] == ["job_fenced"]
    write = {"completed": "complete", "retry": "retry", "dead": "dead"}[kind]
    assert received[0][1] == {
        "job_id": job.id,
        "task": job.task,
        "queue": job.queue,
        "lease": 1,
        "worker": "zombie",
        "write": write,
    }
    assert any(
        f"the {write} write changed nothing" in r.getMessage() and r.levelno == logging.WARNING
        for r in caplog.records
    )


@pytest.mark.django_db(transaction=True)
def test_raising_receivers_cannot_change_outcomes(
    raising: None, caplog: pytest.LogCaptureFixture
) -> None:
    ok = jobs.add.enqueue(1, 2)
    retried = jobs.always_fails.using(max_attempts=2).enqueue()
    dead = jobs.discard_me.enqueue()
    with caplog.at_level(logging.ERROR, logger="django_pgjobs"):
        worker = _burst()
    ok.refresh_from_db()
    assert ok.status == "completed" and ok.result == 3
    retried.refresh_from_db()
    assert retried.attempts >= 1 and retried.status in ("pending", "dead")
    assert all(e["type"] == "builtins.ValueError" for e in retried.errors)
    dead.refresh_from_db()
    assert dead.status == "dead" and dead.attempts == 1
    assert worker.counts["completed"] == 1 and worker.counts["fenced"] == 0
    assert any("raised RuntimeError('receiver bug')" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db
def test_raising_receivers_cannot_stop_run_jobs_or_the_reaper(raising: None) -> None:
    from django_pgjobs.maintenance.reaper import Reaper
    from django_pgjobs.testing import run_jobs
    from tests.helpers.rows import make_job

    job = jobs.add.enqueue(2, 2)
    assert [r.status for r in run_jobs()] == ["completed"]
    job.refresh_from_db()
    assert job.status == "completed"
    stale = make_job("running", heartbeat_age=60)
    assert Reaper(stale_after=10).run_once()["reaped"] == 1
    stale.refresh_from_db()
    assert stale.status == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_plain_completion_still_logs_at_debug_and_calls_back_without_receivers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The completer's report returns early for a plain completion when nothing would
    log, receive or call back; each of those alone still gets its completion."""
    assert not signals.job_succeeded.receivers
    logged = jobs.noop.enqueue()
    with caplog.at_level(logging.DEBUG, logger="django_pgjobs"):
        _burst()
    assert any(
        r.levelno == logging.DEBUG
        and r.getMessage() == f"job {logged.id} (tests.testapp.jobs.noop) completed"
        for r in caplog.records
    )
    called: list[tuple[str, bool]] = []
    claimed = jobs.noop.enqueue()
    Job.objects.filter(id=claimed.id).update(lease=41)  # the next claim makes it 42
    outcomes.after_write(claimed.id, 42, lambda outcome, ours: called.append((outcome.kind, ours)))
    caplog.clear()
    _burst()
    assert called == [("completed", True)]
    assert Job.objects.get(id=claimed.id).status == "completed"
