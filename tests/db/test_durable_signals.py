"""send_signal: stored in the caller's transaction, refused for an unknown or finished
job, a duplicate idempotency key a no-op, bad input refused before any row is written
(docs/reference/api.md)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_pgjobs import send_signal
from django_pgjobs.exceptions import JobFinished, UnknownJob
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.models import Job, JobSignal
from tests.conftest import dsn
from tests.testapp.jobs import noop

pytestmark = pytest.mark.django_db


def test_a_signal_is_stored_for_the_job() -> None:
    job = noop.enqueue()
    signal_id = send_signal(job.id, "approval", {"ok": True})
    signal = JobSignal.objects.get(id=signal_id)
    assert (signal.job_id, signal.name, signal.payload) == (job.id, "approval", {"ok": True})
    assert signal.consumed_at is None and signal.consumed_by is None


def test_no_payload_is_stored_as_null() -> None:
    job = noop.enqueue()
    assert JobSignal.objects.get(id=send_signal(job.id, "go")).payload is None


def test_a_duplicate_idempotency_key_is_a_no_op_returning_the_first() -> None:
    job = noop.enqueue()
    first = send_signal(job.id, "approval", {"n": 1}, idempotency_key="hook-1")
    again = send_signal(job.id, "approval", {"n": 2}, idempotency_key="hook-1")
    assert again == first
    assert list(JobSignal.objects.values_list("payload", flat=True)) == [{"n": 1}]
    # the key is per job: another job takes the same key
    other = noop.enqueue()
    assert send_signal(other.id, "approval", idempotency_key="hook-1") != first


def test_a_signal_commits_and_rolls_back_with_the_callers_transaction() -> None:
    job = noop.enqueue()
    with pytest.raises(RuntimeError), transaction.atomic():
        send_signal(job.id, "approval")
        raise RuntimeError("the caller's own write failed")
    assert not JobSignal.objects.exists()
    with transaction.atomic():
        send_signal(job.id, "approval")
        assert JobSignal.objects.count() == 1


def test_an_unknown_job_is_refused() -> None:
    with pytest.raises(UnknownJob, match="there is no job 987654"):
        send_signal(987654, "approval")
    assert isinstance(UnknownJob("x"), LookupError)


@pytest.mark.parametrize("status", ["completed", "dead", "cancelled"])
def test_a_finished_job_is_refused(status: str) -> None:
    job = noop.enqueue()
    Job.objects.filter(id=job.id).update(status=status, finished_at=timezone.now())
    with pytest.raises(JobFinished, match=rf"job {job.id} is {status}"):
        send_signal(job.id, "approval", idempotency_key="k")
    assert not JobSignal.objects.exists()


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda j: send_signal(str(j), "a"), TypeError, "job_id must be a job's id"),
        (lambda j: send_signal(True, "a"), TypeError, "job_id must be a job's id"),
        (lambda j: send_signal(0, "a"), ValueError, "job_id must be a positive job id"),
        (lambda j: send_signal(j, ""), ValueError, "signal name must be a non-empty string"),
        (lambda j: send_signal(j, 5), ValueError, "signal name must be a non-empty string"),
        (lambda j: send_signal(j, "x" * 256), ValueError, "at most 255 characters"),
        (lambda j: send_signal(j, "a\x00"), ValueError, "signal name contains a NUL"),
        (lambda j: send_signal(j, "a", {1: 2}), TypeError, "the signal payload has a non-string"),
        (lambda j: send_signal(j, "a", (1, 2)), TypeError, "use a list"),
        (lambda j: send_signal(j, "a", float("nan")), TypeError, "which JSON cannot represent"),
        (lambda j: send_signal(j, "a", idempotency_key=""), ValueError, "idempotency_key must"),
        (lambda j: send_signal(j, "a", idempotency_key=7), ValueError, "idempotency_key must"),
    ],
)
def test_bad_input_names_the_argument_and_writes_nothing(
    call: Any, error: type[Exception], match: str
) -> None:
    job = noop.enqueue()
    with pytest.raises(error, match=match):
        call(job.id)
    assert not JobSignal.objects.exists()


def test_a_payload_larger_than_max_args_bytes_is_refused(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "MAX_ARGS_BYTES": 100}
    job = noop.enqueue()
    send_signal(job.id, "a", "x" * 90)  # 92 bytes of JSON text
    with pytest.raises(
        ValueError, match=r"signal payload is 1,002 bytes .*MAX_ARGS_BYTES'\] = 100"
    ):
        send_signal(job.id, "a", "x" * 1000)
    assert JobSignal.objects.count() == 1


def test_a_jobs_signals_are_pruned_with_it(settings: Any) -> None:
    job, kept = noop.enqueue(), noop.enqueue()
    send_signal(job.id, "a")
    send_signal(kept.id, "a")
    Job.objects.filter(id=job.id).update(
        status="completed", finished_at=timezone.now() - timezone.timedelta(days=30)
    )
    assert Pruner().run_once()["by_status"]["completed"] == 1
    assert list(JobSignal.objects.values_list("job_id", flat=True)) == [kept.id]


@pytest.mark.django_db(transaction=True)
def test_concurrent_sends_of_one_key_store_one_signal() -> None:
    """Two transactions send the same key at once: the second waits for the first's
    commit, then writes nothing and returns the first signal's id."""
    job = noop.enqueue()
    barrier = threading.Barrier(2)
    ids: list[int] = []

    with psycopg.connect(dsn(), autocommit=False) as other:
        # the other sender holds its key, uncommitted
        other.execute(
            "INSERT INTO django_pgjobs_jobsignal (job_id, name, idempotency_key) "
            "VALUES (%s, 'a', 'same')",
            [job.id],
        )

        def send() -> None:
            barrier.wait()
            ids.append(send_signal(job.id, "a", idempotency_key="same"))
            connection.close()

        thread = threading.Thread(target=send)
        thread.start()
        barrier.wait()
        thread.join(0.5)
        assert thread.is_alive(), "the second sender did not wait for the first's key"
        other.commit()
        thread.join(10)
    assert JobSignal.objects.count() == 1
    assert ids == [JobSignal.objects.get().id]
