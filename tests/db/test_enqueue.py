"""Enqueueing: transactional, idempotent, validated (docs/reference/api.md)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_pgjobs.db.notify import Payload, parse_payload
from django_pgjobs.exceptions import UnknownTask
from django_pgjobs.models import Job, JobResult
from django_pgjobs.states import JobStatus
from tests.conftest import dsn
from tests.testapp.jobs import add, noop, send_email, whoami

pytestmark = pytest.mark.django_db


def test_enqueue_returns_the_row_with_definition_defaults() -> None:
    job = send_email.enqueue("a@example.com", subject="hello")
    assert isinstance(job, Job)
    assert job.pk is not None
    assert job.task == "tests.testapp.jobs.send_email"
    assert (job.queue, job.priority, job.max_attempts) == ("emails", 5, 3)
    assert job.args == ["a@example.com"]
    assert job.kwargs == {"subject": "hello"}
    assert job.status == JobStatus.PENDING
    assert job.attempts == 0 and job.lease == 0
    assert job.run_at <= timezone.now()
    fresh = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:  # every column, as the database has it
        assert getattr(job, field.attname) == getattr(fresh, field.attname), field.attname


def test_max_attempts_default_comes_from_settings(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "MAX_ATTEMPTS": 9}
    assert add.enqueue(1, 2).max_attempts == 9


def test_using_overrides_and_returns_a_copy() -> None:
    when = timezone.now() + timedelta(hours=1)
    variant = add.using(queue="slow", priority=-7, run_at=when, max_attempts=2)
    job = variant.enqueue(1, 2)
    assert (job.queue, job.priority, job.run_at, job.max_attempts) == ("slow", -7, when, 2)
    plain = add.enqueue(1, 2)
    assert (plain.queue, plain.priority) == ("default", 0)


def test_delay_sets_run_at_in_the_future() -> None:
    before = timezone.now()
    job = add.using(delay=timedelta(minutes=5)).enqueue(1, 2)
    assert before + timedelta(minutes=5) <= job.run_at <= timezone.now() + timedelta(minutes=5)
    job = add.using(delay=30).enqueue(1, 2)
    assert job.run_at >= before + timedelta(seconds=30)


def test_enqueue_by_name_is_the_same_thing() -> None:
    job = Job.objects.enqueue("tests.testapp.jobs.add", args=[2, 3], priority=4, queue="q")
    assert (job.task, job.args, job.kwargs, job.priority, job.queue) == (
        "tests.testapp.jobs.add",
        [2, 3],
        {},
        4,
        "q",
    )


def test_direct_call_runs_inline_and_writes_nothing() -> None:
    assert add(2, 3) == 5
    assert whoami.__name__ == "whoami"
    assert not Job.objects.exists()


def test_enqueue_many_inserts_all_rows_with_options() -> None:
    count = add.using(priority=3, queue="bulk").enqueue_many(
        [(i, i) for i in range(1200)] + [([1], {"b": 2})]
    )
    assert count == 1201
    assert (
        Job.objects.filter(task="tests.testapp.jobs.add", queue="bulk", priority=3).count() == 1201
    )
    assert Job.objects.filter(args=[1], kwargs={"b": 2}).count() == 1
    assert noop.enqueue_many([]) == 0


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_copy_goes_through_execute_wrappers(monkeypatch: Any) -> None:
    """Instrumentation installed with ``connection.execute_wrapper`` sees each COPY
    batch (as an ``executemany``), and may fail it: then nothing is written."""
    from django_pgjobs.jobs import enqueue

    monkeypatch.setattr(enqueue, "BULK_BATCH", 2)
    seen: list[tuple[str, int, bool]] = []

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("COPY"):
            seen.append((sql, len(params), many))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        assert add.enqueue_many([(1, 2), (3, 4), (5, 6)]) == 3
    assert [(n, many) for _, n, many in seen] == [(2, True), (1, True)]
    assert all(sql.startswith("COPY django_pgjobs_job (task,") for sql, _, _ in seen)
    assert Job.objects.filter(task=add.name).count() == 3

    def fail_second_copy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("COPY") and len(seen) == 3:
            raise RuntimeError("refused by the wrapper")
        if sql.startswith("COPY"):
            seen.append((sql, len(params), many))
        return execute(sql, params, many, context)

    with (
        connection.execute_wrapper(fail_second_copy),
        pytest.raises(RuntimeError, match="refused"),
    ):
        add.enqueue_many([(7, 8), (9, 10), (11, 12)])
    assert Job.objects.filter(task=add.name).count() == 3


def test_idempotency_key_returns_existing_job_and_writes_nothing() -> None:
    first = add.using(idempotency_key="order:1").enqueue(1, 2)
    second = add.using(idempotency_key="order:1").enqueue(100, 200)
    assert second.pk == first.pk
    assert second.args == [1, 2]
    assert Job.objects.filter(idempotency_key="order:1").count() == 1
    third = Job.objects.enqueue("tests.testapp.jobs.add", args=[5, 5], idempotency_key="order:1")
    assert third.pk == first.pk


def test_result_survives_for_keyed_jobs() -> None:
    from django_pgjobs.testing import run_jobs

    add.using(idempotency_key="sum:1").enqueue(1, 2)
    assert [r.status for r in run_jobs()] == ["completed"]
    assert JobResult.objects.get(idempotency_key="sum:1").value == 3


@pytest.mark.django_db(transaction=True)
def test_rollback_removes_the_job() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue(1, 2)
        assert Job.objects.count() == 1
        raise RuntimeError("business write failed")
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_job_invisible_to_other_connections_until_commit() -> None:
    with psycopg.connect(dsn(), autocommit=True) as other:
        with transaction.atomic():
            job = add.enqueue(1, 2)
            seen = other.execute(
                "SELECT count(*) FROM django_pgjobs_job WHERE id = %s", [job.pk]
            ).fetchone()
            assert seen == (0,)
        seen = other.execute(
            "SELECT count(*) FROM django_pgjobs_job WHERE id = %s", [job.pk]
        ).fetchone()
        assert seen == (1,)


@pytest.mark.django_db(transaction=True)
def test_notify_is_sent_at_commit_only() -> None:
    with psycopg.connect(dsn(), autocommit=True) as listener:
        listener.execute("LISTEN pgjobs")
        with transaction.atomic():
            job = send_email.enqueue("x@example.com")
            assert list(listener.notifies(timeout=0.3)) == []
        notes = list(listener.notifies(timeout=2, stop_after=1))
        # The queue, and when the job is due (the claim front: claim/front.py).
        assert [parse_payload(n.payload) for n in notes] == [Payload("emails", job.run_at, 5)]
        with pytest.raises(RuntimeError), transaction.atomic():
            send_email.enqueue("y@example.com")
            raise RuntimeError
        assert list(listener.notifies(timeout=0.3)) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_of_one_key_produce_one_row() -> None:
    from django.db import connections

    barrier = threading.Barrier(8)
    ids: list[int] = []
    errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            barrier.wait()
            ids.append(add.using(idempotency_key="race").enqueue(1, 2).pk)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(ids) == 8 and len(set(ids)) == 1
    assert Job.objects.filter(idempotency_key="race").count() == 1


# ---------------------------------------------------------------- bad input

BAD_CALLS = [
    (lambda: add.enqueue(1), TypeError, "missing a required argument: 'b'"),
    (lambda: add.enqueue(1, 2, 3), TypeError, "too many positional arguments"),
    (lambda: add.enqueue(1, c=3), TypeError, "add()"),
    (lambda: add.enqueue(1, timezone.now()), TypeError, "argument 'b'"),
    (lambda: add.enqueue(1, {1: "a"}), TypeError, "non-string key"),
    (lambda: add.enqueue(1, (1, 2)), TypeError, "use a list"),
    (lambda: add.enqueue(1, float("nan")), TypeError, "argument 'b'"),
    (lambda: add.enqueue(1, {"x": {1, 2}}), TypeError, "argument 'b'['x']"),
    (lambda: add.using(priority=101), ValueError, "priority"),
    (lambda: add.using(priority=-101), ValueError, "priority"),
    (lambda: add.using(priority=1.5), ValueError, "priority"),
    (lambda: add.using(priority=True), ValueError, "priority"),
    (lambda: add.using(run_at=timezone.now().replace(tzinfo=None)), ValueError, "aware"),
    (lambda: add.using(run_at="tomorrow"), TypeError, "run_at"),
    (lambda: add.using(delay=-1), ValueError, "delay"),
    (lambda: add.using(delay="5m"), TypeError, "delay"),
    (lambda: add.using(run_at=timezone.now(), delay=5), TypeError, "either run_at or delay"),
    (lambda: add.using(max_attempts=0), ValueError, "max_attempts"),
    (lambda: add.using(queue=""), ValueError, "queue"),
    (lambda: add.using(queue="a,b"), ValueError, "queue"),
    (lambda: add.using(idempotency_key=""), ValueError, "idempotency_key"),
    (lambda: add.using(idempotency_key="k" * 256), ValueError, "idempotency_key"),
    (lambda: add.using(prority=1), TypeError, "Did you mean 'priority'"),
    (
        lambda: Job.objects.enqueue("tests.testapp.jobs.ad", args=[1, 2]),
        UnknownTask,
        "tests.testapp.jobs.add",
    ),
    (lambda: Job.objects.enqueue("os.system", args=["true"]), LookupError, "unknown task"),
    (
        lambda: Job.objects.enqueue("tests.testapp.jobs.add", args=[1, 2], priorty=1),
        TypeError,
        "priority",
    ),
    (lambda: Job.objects.enqueue("tests.testapp.jobs.add", args="12"), TypeError, "list"),
    (lambda: add.enqueue_many([(1, 2), (3,)]), TypeError, "item 1"),
    (lambda: add.enqueue_many([(1, 2), 5]), TypeError, "item 1"),
    (lambda: add.enqueue_many([(1, timezone.now())]), TypeError, "item 0"),
    (lambda: add.using(idempotency_key="k").enqueue_many([(1, 2)]), ValueError, "idempotency_key"),
]


@pytest.mark.parametrize(("call", "exc_type", "fragment"), BAD_CALLS)
def test_bad_input_is_refused_clearly_and_writes_nothing(
    call: Any, exc_type: type, fragment: str
) -> None:
    with pytest.raises(exc_type) as info:
        call()
    assert fragment in str(info.value)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_pgjobs_job")
        assert cursor.fetchone() == (0,)


def test_bad_batch_writes_nothing_even_when_early_items_are_fine() -> None:
    calls = [(i, i) for i in range(100)] + [(1, object())]
    with pytest.raises(TypeError, match="item 100"):
        add.enqueue_many(calls)
    assert not Job.objects.exists()


def test_enqueue_shows_in_query_logging(django_assert_num_queries: Any) -> None:
    """The hot-path cursor falls back to Django's when queries are logged."""
    with django_assert_num_queries(1):
        add.enqueue(1, 2)


def test_enqueue_refuses_a_broken_atomic_block() -> None:
    from django.db.transaction import TransactionManagementError

    with transaction.atomic():
        transaction.set_rollback(True)  # as after a caught database error
        with pytest.raises(TransactionManagementError):
            add.enqueue(1, 2)


def test_database_errors_come_out_as_django_errors() -> None:
    from django.db import IntegrityError as DjangoIntegrityError

    with pytest.raises(DjangoIntegrityError), transaction.atomic():
        # a CHECK constraint the validation would normally catch first
        from django_pgjobs.db.cursor import hot_cursor

        with hot_cursor(connection) as cursor:
            cursor.execute("INSERT INTO django_pgjobs_job (task, priority) VALUES ('x', 500)")


def test_the_insert_statements_are_one_family_with_named_parameters() -> None:
    from django_pgjobs.db.job_insert import (
        INSERT_PARAMS,
        JOB_INSERT,
        JOB_INSERT_DELAYED,
        JOB_INSERT_FLOW,
        JOB_INSERT_FLOW_DELAYED,
        insert_params,
    )

    base = "task, queue, priority, args, kwargs, run_at, max_attempts, idempotency_key, timeout"
    members = {
        (False, False): JOB_INSERT,
        (False, True): JOB_INSERT_DELAYED,
        (True, False): JOB_INSERT_FLOW,
        (True, True): JOB_INSERT_FLOW_DELAYED,
    }
    for flow in (False, True):
        for delayed in (False, True):
            text = members[flow, delayed]
            assert f"({base}, trace_context" in text
            assert ("concurrency_key, concurrency_limit, fair_key, unique_key)" in text) == flow
            assert ("%(delay)s" in text) == delayed and ("%(run_at)s" in text) != delayed
            assert "%s" not in text  # named only: a new column cannot shift the others
    params = insert_params(task="t", run_at=None)
    assert params.keys() == INSERT_PARAMS and params["task"] == "t"
    with pytest.raises(TypeError, match="not a parameter of the job insert: colour"):
        insert_params(task="t", colour="red")
