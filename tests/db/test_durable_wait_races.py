"""Waits racing senders on real connections (threads, each its own transaction): a send
or an emit still open while the wait looks, a send in flight or committed between the
look and the park, a REPEATABLE READ send older than the park, and two sends at once to
one wait."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.db import connection, transaction

from django_pgjobs import emit_event, send_signal
from django_pgjobs.models import Job, JobSignal
from django_pgjobs.testing import run_jobs
from tests import signal_jobs
from tests.conftest import dsn, wait_until
from tests.signal_jobs import HOOK, RUNS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()
    HOOK.update(after_look=None, before_wait=None)


class OpenSender:
    """A sender in a thread of its own: sends in a transaction, then holds it open
    until ``commit()``."""

    def __init__(self, send: Callable[[], None]) -> None:
        self.sent = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                with transaction.atomic():
                    send()
                    self.sent.set()
                    self.release.wait(30)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.error = exc
                self.sent.set()
            finally:
                connection.close()

        self.thread = threading.Thread(target=run)

    def start(self) -> None:
        self.thread.start()
        assert self.sent.wait(30), "the sender did not send"
        assert self.error is None, self.error

    def commit(self) -> None:
        self.release.set()
        self.thread.join(30)
        assert self.error is None, self.error


def _commit_once_waited_on(kind: str, sender: OpenSender, problems: list[str]) -> None:
    """In a thread: commit ``sender`` once a backend waits for a lock of ``kind``
    (the look or the park blocked behind it), noting in ``problems`` if none did."""

    def run() -> None:
        try:
            wait_until(_waiting_on_lock(kind), timeout=20, message=f"a wait on a {kind} lock")
        except AssertionError as exc:
            problems.append(str(exc))
        sender.commit()

    threading.Thread(target=run).start()


def _waiting_on_lock(kind: str) -> Callable[[], bool]:
    """Whether a backend of this database waits for a lock of ``kind`` (pg_locks)."""

    def check() -> bool:
        with psycopg.connect(dsn(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = %s", [kind]
            ).fetchone()
        return bool(row and row[0])

    return check


def test_an_event_emitted_while_the_wait_looks_is_seen_by_the_look() -> None:
    """The emit holds its shared lock until it commits; the look's exclusive lock waits
    for that commit, and the look (a later snapshot) finds the event: one run."""
    job = signal_jobs.parks_then_hook.enqueue("event")
    emitter = OpenSender(lambda: emit_event("invoice.paid", key="42", payload="in flight"))

    problems: list[str] = []

    def before_wait() -> None:
        emitter.start()
        _commit_once_waited_on("advisory", emitter, problems)

    HOOK["before_wait"] = before_wait
    [ran] = run_jobs()
    assert not problems, problems
    assert (ran.status, ran.value) == ("completed", "in flight")
    assert [job.id] == RUNS


def test_a_signal_sent_while_the_wait_looks_is_seen_by_the_look() -> None:
    """The send holds the job's signal lock shared until it commits, and no lock on the
    running job's row; the look's exclusive lock waits for that commit, and the look
    (a later snapshot) takes the signal: one run."""
    job = signal_jobs.parks_then_hook.enqueue("signal")
    sender = OpenSender(lambda: send_signal(job.id, "approval", "in flight"))

    problems: list[str] = []

    def before_wait() -> None:
        sender.start()
        _commit_once_waited_on("advisory", sender, problems)

    HOOK["before_wait"] = before_wait
    [ran] = run_jobs()
    assert not problems, problems
    assert (ran.status, ran.value) == ("completed", "in flight")
    assert [job.id] == RUNS


def test_a_signal_in_flight_at_the_park_leaves_the_job_pending() -> None:
    """A send that begins after the look (which found nothing) and is still open at the
    park: the park cannot take the signal lock, so it leaves the job pending without
    waiting for the sender; the next run's look waits for the send's commit and takes
    the signal."""
    job = signal_jobs.parks_then_hook.enqueue("signal")
    sender = OpenSender(lambda: send_signal(job.id, "approval", "in flight"))

    problems: list[str] = []

    def after_look() -> None:
        HOOK["after_look"] = None  # this run only
        sender.start()
        # Committed once the second run's look waits for it: the park did not wait.
        _commit_once_waited_on("advisory", sender, problems)

    HOOK["after_look"] = after_look
    first, second = run_jobs()
    assert not problems, problems
    assert first.status == "waiting"  # the run parked ...
    assert (second.status, second.value) == ("completed", "in flight")  # ... as pending
    assert JobSignal.objects.get().consumed_by == "approval#1"
    assert [job.id, job.id] == RUNS


def test_a_signal_committed_between_the_look_and_the_park_leaves_the_job_pending() -> None:
    """A send that commits after the look found nothing and before the park (it found
    the row running, so it woke nothing): the park, whose snapshot follows its lock,
    sees the unconsumed signal and leaves the job pending."""
    job = signal_jobs.parks_then_hook.enqueue("signal")

    def after_look() -> None:
        HOOK["after_look"] = None
        send_signal(job.id, "approval", "between")

    HOOK["after_look"] = after_look
    first, second = run_jobs()
    assert first.status == "waiting"
    assert (second.status, second.value) == ("completed", "between")
    assert Job.objects.get(id=job.id).wakes == 0  # no waker touched the running row


def test_a_repeatable_read_send_older_than_the_park_is_a_serialization_error() -> None:
    """A REPEATABLE READ caller's snapshot can predate the park: its send locks the
    row instead, and a row parked since its snapshot is a serialization failure (the
    caller retries), never a signal stored beside a job left waiting."""
    job = signal_jobs.approval.enqueue()
    snapshot, parked = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def send() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    cursor.execute("SELECT 1")  # the snapshot, before the park
                snapshot.set()
                assert parked.wait(30)
                send_signal(job.id, "approval", "old snapshot")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=send)
    thread.start()
    assert snapshot.wait(30)
    [ran] = run_jobs()
    parked.set()
    thread.join(30)
    assert ran.status == "waiting"
    assert [type(e.__cause__).__name__ for e in errors] == ["SerializationFailure"]
    assert not JobSignal.objects.exists()
    send_signal(job.id, "approval", "retried")  # the caller's retry wakes it
    [ran] = run_jobs()
    assert (ran.status, ran.value) == ("completed", {"answer": "retried"})


def test_two_signals_sent_at_once_to_one_wait_one_consumed_one_kept() -> None:
    job = signal_jobs.approval.enqueue()
    [ran] = run_jobs()
    assert ran.status == "waiting"
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def send(n: int) -> None:
        try:
            barrier.wait(10)
            send_signal(job.id, "approval", n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert Job.objects.get(id=job.id).status == "pending"
    [ran] = run_jobs()
    assert ran.status == "completed"
    consumed = JobSignal.objects.get(consumed_at__isnull=False)
    kept = JobSignal.objects.get(consumed_at__isnull=True)
    assert ran.value == {"answer": consumed.payload}
    assert {consumed.payload, kept.payload} == {1, 2}
    assert consumed.id < kept.id  # the oldest is taken first
