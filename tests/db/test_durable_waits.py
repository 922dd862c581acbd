"""Waits for signals and events, run in the test's process (``run_jobs``): a signal
sent before the wait is kept and consumed once, a wait parks the job and the send
wakes it in the sender's transaction, a timeout returns None, a re-run returns what
the wait received, an event within the lookback counts, and a signal or an event
that commits between a wait's look and its park is not lost."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_pgjobs import emit_event, send_signal
from django_pgjobs.exceptions import JobFinished
from django_pgjobs.models import Job, JobEvent, JobSignal, JobStep
from django_pgjobs.testing import run_jobs
from tests import signal_jobs
from tests.signal_jobs import HOOK, RUNS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()
    HOOK.update(after_look=None, before_wait=None)


def _row(job_id: int) -> Job:
    return Job.objects.get(id=job_id)


def test_a_signal_sent_before_the_wait_is_kept_and_consumed_once() -> None:
    job = signal_jobs.approval.enqueue()
    send_signal(job.id, "approval", {"ok": True})
    [ran] = run_jobs()
    assert (ran.status, ran.value) == ("completed", {"answer": {"ok": True}})
    signal = JobSignal.objects.get()
    assert signal.consumed_at is not None and signal.consumed_by == "approval#1"
    steps = JobStep.objects.filter(job_id=job.id).order_by("seq")
    assert [(s.name, s.occurrence, s.kind) for s in steps] == [
        ("approval", 0, "signal"),
        ("approval", 1, "signal"),
    ]
    assert steps[1].result == {"signal": signal.id, "payload": {"ok": True}}


def test_a_wait_parks_the_job_and_the_send_wakes_it_in_the_senders_transaction() -> None:
    job = signal_jobs.approval.enqueue()
    [ran] = run_jobs()
    assert ran.status == "waiting"
    row = _row(job.id)
    assert (row.status, row.waiting_for, row.attempts) == (
        "waiting",
        {"kind": "signal", "name": "approval"},
        0,
    )
    with transaction.atomic():
        send_signal(job.id, "other")  # another name: the job keeps waiting
        assert _row(job.id).status == "waiting"
        send_signal(job.id, "approval", "yes")
        assert (_row(job.id).status, _row(job.id).waiting_for) == ("pending", None)
    [ran] = run_jobs()
    assert (ran.status, ran.value) == ("completed", {"answer": "yes"})
    assert JobSignal.objects.filter(name="other", consumed_at__isnull=True).count() == 1


def test_a_wait_that_times_out_returns_none_and_records_it() -> None:
    job = signal_jobs.approval.enqueue(timeout=3600)
    [ran] = run_jobs()
    assert ran.status == "waiting"
    assert _row(job.id).run_at > timezone.now() + timedelta(minutes=59)  # woken at the timeout
    assert run_jobs(advance=timedelta(minutes=30)) == []
    [ran] = run_jobs(advance=timedelta(minutes=31))
    assert (ran.status, ran.value) == ("completed", {"answer": None})
    last = JobStep.objects.filter(job_id=job.id).order_by("seq").last()
    assert last is not None and last.result == {"timed_out": True}
    with pytest.raises(JobFinished):  # a finished job takes no more signals
        send_signal(job.id, "approval")
    assert not JobSignal.objects.exists()


@pytest.mark.django_db(transaction=True)  # the retry's backoff passes on the real clock
def test_a_rerun_returns_the_payload_the_wait_received_without_taking_another() -> None:
    job = signal_jobs.approval_then_fail_once.enqueue()
    send_signal(job.id, "approval", {"n": 1})
    send_signal(job.id, "approval", {"n": 2})
    runs = run_jobs()  # its retry may come due within the call (a backoff of 0.05 s)
    if len(runs) == 1:
        Job.objects.filter(id=job.id).update(run_at=timezone.now())  # its backoff, passed
        runs += run_jobs()
    assert [r.status for r in runs] == ["pending", "completed"]  # failed once, retried
    assert runs[1].value == {"n": 1}
    kept = JobSignal.objects.get(consumed_at__isnull=True)
    assert kept.payload == {"n": 2}


def test_two_signals_to_one_wait_one_consumed_one_kept() -> None:
    job = signal_jobs.approval.enqueue()
    [ran] = run_jobs()
    assert ran.status == "waiting"
    with transaction.atomic():
        send_signal(job.id, "approval", 1)
        send_signal(job.id, "approval", 2)
    [ran] = run_jobs()
    assert ran.value == {"answer": 1}
    assert list(JobSignal.objects.order_by("id").values_list("payload", "consumed_by")) == [
        (1, "approval#1"),
        (2, None),
    ]


def test_each_wait_of_a_loop_takes_its_own_signal() -> None:
    job = signal_jobs.two_approvals.enqueue()
    send_signal(job.id, "approval", "a")
    [ran] = run_jobs()
    assert ran.status == "waiting"
    send_signal(job.id, "approval", "b")
    [ran] = run_jobs()
    assert (ran.status, ran.value) == ("completed", ["a", "b"])


def test_a_signal_rolled_back_with_its_sender_wakes_nobody() -> None:
    job = signal_jobs.approval.enqueue()
    run_jobs()
    with pytest.raises(RuntimeError), transaction.atomic():
        send_signal(job.id, "approval")
        raise RuntimeError("the sender's own write failed")
    assert _row(job.id).status == "waiting"
    assert run_jobs() == []


def test_an_event_within_the_lookback_counts_and_an_older_one_does_not() -> None:
    old = emit_event("invoice.paid", key="41", payload="old")
    JobEvent.objects.filter(id=old).update(created_at=timezone.now() - timedelta(hours=2))
    emit_event("invoice.paid", key="42", payload={"amount": 5})
    emit_event("invoice.paid", payload="no key")
    counted = signal_jobs.paid.enqueue("42")
    too_old = signal_jobs.paid.enqueue("41", lookback=3600)
    no_key = signal_jobs.paid.enqueue(None)
    ran = {r.id: r for r in run_jobs()}
    assert ran[counted.id].value == {"paid": {"amount": 5}}
    assert ran[no_key.id].value == {"paid": "no key"}
    assert ran[too_old.id].status == "waiting"
    assert _row(too_old.id).waiting_for == {"kind": "event", "name": "invoice.paid", "key": "41"}


def test_an_event_wakes_every_job_waiting_on_its_name_and_key() -> None:
    waiting = [signal_jobs.paid.enqueue("7") for _ in range(3)]
    other = signal_jobs.paid.enqueue("8")
    assert {r.status for r in run_jobs()} == {"waiting"}
    with transaction.atomic():
        emit_event("invoice.paid", key="7", payload="seven")
        assert {_row(j.id).status for j in waiting} == {"pending"}
    assert _row(other.id).status == "waiting"
    ran = run_jobs()
    assert sorted(r.id for r in ran) == sorted(j.id for j in waiting)
    assert {r.value["paid"] for r in ran} == {"seven"}


def test_bad_wait_arguments_name_the_argument() -> None:
    from django_pgjobs.jobs.context import JobContext

    job = signal_jobs.approval.enqueue()
    context = JobContext(job_id=job.id, task="t", attempt=1, max_attempts=1, lease=0, queue="q")
    with pytest.raises(ValueError, match="signal name must be a non-empty string"):
        context.wait_for_signal("")
    with pytest.raises(TypeError, match="wait_for_signal 'a': timeout must be a timedelta"):
        context.wait_for_signal("a", timeout="soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be a duration of at least 0"):
        context.wait_for_signal("a", timeout=-1)
    with pytest.raises(ValueError, match="key must be a non-empty string"):
        context.wait_for_event("e", key=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lookback 8,640,000s is longer than PGJOBS"):
        context.wait_for_event("e", lookback=timedelta(days=100))
    assert not JobStep.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["signal", "event"])
def test_a_wake_that_commits_between_the_look_and_the_park_is_not_lost(kind: str) -> None:
    """The wait looked and found nothing; before the park, another connection commits
    the signal (or the event): the park sees ``wakes`` moved and leaves the job pending,
    and its next run receives it."""
    job = signal_jobs.parks_then_hook.enqueue(kind)

    def commit_elsewhere() -> None:
        import threading

        def send() -> None:
            from django.db import connection

            if kind == "signal":
                send_signal(job.id, "approval", "late")
            else:
                emit_event("invoice.paid", key="42", payload="late")
            connection.close()

        thread = threading.Thread(target=send)
        thread.start()
        thread.join(30)

    HOOK["after_look"] = commit_elsewhere
    # The run parked, but the park left the job pending and due: it runs again at once.
    first, second = run_jobs()
    assert first.status == "waiting"  # the run's outcome: it parked
    assert (second.status, second.value) == ("completed", "late")
    assert [job.id, job.id] == RUNS
