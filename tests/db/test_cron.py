"""Built-in recurring jobs: schedules, system checks, the ticker (injected clock), pgjobs_enqueue."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections

from django_pgjobs.db.notify import parse_payload
from django_pgjobs.maintenance import cron as cron_module
from django_pgjobs.maintenance.cron import CronTicker, Schedule
from django_pgjobs.models import Job
from tests.conftest import dsn
from tests.helpers.freeze import frozen_after, in_thread

ADD = "tests.testapp.jobs.add"
T0 = datetime(2024, 5, 1, 10, 30, 0, tzinfo=UTC)


def hourly(name: str = "h", *, at: str = "0 * * * *", **kw: Any) -> Schedule:
    return Schedule(name=name, task=ADD, expression=at, args=[1, 2], **kw)


# --------------------------------------------------------------------- schedules


# --------------------------------------------------------------------- the ticker


def keys() -> list[str]:
    return sorted(
        Job.objects.exclude(idempotency_key=None).values_list("idempotency_key", flat=True)
    )


@pytest.mark.django_db(transaction=True)
def test_first_tick_enqueues_only_the_most_recent_missed_fire_time() -> None:
    ticker = CronTicker(schedules=[hourly()], catchup_window=3600)
    assert ticker.run_once(now=T0) == {"due": 1, "inserted": 1, "existing": 0, "failed": 0}
    job = Job.objects.get()
    assert job.idempotency_key == "cron:h:2024-05-01T10:00:00Z"
    assert job.run_at == T0.replace(minute=0) and job.args == [1, 2] and job.task == ADD
    # Nothing new until the next fire time; then exactly that one.
    assert ticker.run_once(now=T0 + timedelta(seconds=1))["due"] == 0
    ticker.run_once(now=T0 + timedelta(seconds=2))
    assert ticker.run_once(now=T0.replace(hour=11) + timedelta(milliseconds=400))["inserted"] == 1
    assert keys() == ["cron:h:2024-05-01T10:00:00Z", "cron:h:2024-05-01T11:00:00Z"]


@pytest.mark.django_db(transaction=True)
def test_missed_fire_time_older_than_the_window_is_skipped() -> None:
    ticker = CronTicker(schedules=[hourly()], catchup_window=600)
    assert ticker.run_once(now=T0)["due"] == 0
    assert keys() == []


@pytest.mark.django_db(transaction=True)
def test_continuous_ticks_enqueue_every_fire_time_gaps_coalesce() -> None:
    every_second = hourly("s", at="* * * * * *")
    ticker = CronTicker(schedules=[every_second], catchup_window=3600, interval=1)
    ticker.run_once(now=T0)  # :00 (startup: latest only)
    ticker.run_once(now=T0 + timedelta(seconds=2, milliseconds=500))  # :01, :02 (continuous)
    ticker.run_once(now=T0 + timedelta(seconds=200))  # gap of 197 s: only 3:20
    assert keys() == [
        "cron:s:2024-05-01T10:30:00Z",
        "cron:s:2024-05-01T10:30:01Z",
        "cron:s:2024-05-01T10:30:02Z",
        "cron:s:2024-05-01T10:33:20Z",
    ]


@pytest.mark.django_db(transaction=True)
def test_replicas_racing_one_fire_time_make_exactly_one_job() -> None:
    """Eight tickers (own connections, like replicas) fire the same instant at once."""
    schedules = [hourly("a"), hourly("b", at="30 10 * * *")]
    barrier = threading.Barrier(8)
    results: list[dict[str, Any]] = []
    failures: list[BaseException] = []

    def replica() -> None:
        try:
            ticker = CronTicker(schedules=schedules, catchup_window=3600)
            barrier.wait(timeout=10)
            results.append(ticker.run_once(now=T0))
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=replica) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert failures == []
    assert sum(r["inserted"] for r in results) == 2
    assert sum(r["existing"] for r in results) == 14
    assert keys() == ["cron:a:2024-05-01T10:00:00Z", "cron:b:2024-05-01T10:30:00Z"]


@pytest.mark.django_db(transaction=True)
def test_a_ticker_frozen_after_its_insert_holds_no_other_ticker(monkeypatch: Any) -> None:
    """A replica frozen (SIGSTOP) right after inserting a fire time's job: the others
    see the job (existing) at once. Inside a BEGIN ... COMMIT the frozen insert held the
    key uncommitted and the others' ON CONFLICT waited on it, their maintenance thread
    (and reaper) with it."""

    def replica(results: list[dict[str, Any]]) -> None:
        results.append(CronTicker(schedules=[hourly()], catchup_window=3600).run_once(now=T0))

    first: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    with frozen_after(monkeypatch, cron_module, "job_insert", lambda: replica(first)):
        thread = in_thread(lambda: replica(other))
        thread.join(timeout=10)
        done = not thread.is_alive()
    thread.join(timeout=30)
    assert done, "a ticker waited for the frozen ticker's transaction"
    assert other == [{"due": 1, "inserted": 0, "existing": 1, "failed": 0}]
    assert first == [{"due": 1, "inserted": 1, "existing": 0, "failed": 0}]
    assert keys() == ["cron:h:2024-05-01T10:00:00Z"]


@pytest.mark.django_db(transaction=True)
def test_ticker_wakes_listening_workers() -> None:
    with psycopg.connect(dsn(), autocommit=True) as listener:
        listener.execute("LISTEN pgjobs")
        CronTicker(schedules=[hourly(queue="cronq")], catchup_window=3600).run_once(now=T0)
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert [parse_payload(p).queue for p in payloads] == ["cronq"]


# --------------------------------------------------------------------- pgjobs_enqueue()


def call(sql: str, *params: Any) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


@pytest.mark.django_db(transaction=True)
def test_pgjobs_enqueue_defaults_match_the_python_enqueue() -> None:
    noop = "tests.testapp.jobs.noop"
    (new_id,) = call("SELECT pgjobs_enqueue(%s)", noop)
    sql_job = Job.objects.get(id=new_id)
    py_job = Job.objects.enqueue(noop)
    for field in (
        "queue",
        "priority",
        "args",
        "kwargs",
        "status",
        "attempts",
        "lease",
        "max_attempts",
        "errors",
        "idempotency_key",
    ):
        assert getattr(sql_job, field) == getattr(py_job, field), field


@pytest.mark.django_db(transaction=True)
def test_pgjobs_enqueue_all_arguments_and_key_conflict() -> None:
    run_at = datetime(2030, 1, 1, tzinfo=UTC)
    (first,) = call(
        "SELECT pgjobs_enqueue(%s, %s::jsonb, %s::jsonb, %s, %s, %s, %s, %s)",
        ADD,
        "[1]",
        '{"b": 2}',
        "q",
        -3,
        run_at,
        "key-1",
        9,
    )
    job = Job.objects.get(id=first)
    assert (
        job.args,
        job.kwargs,
        job.queue,
        job.priority,
        job.run_at,
        job.idempotency_key,
        job.max_attempts,
    ) == ([1], {"b": 2}, "q", -3, run_at, "key-1", 9)
    assert call("SELECT pgjobs_enqueue(%s, idempotency_key => %s)", ADD, "key-1") == (None,)
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("call_sql", "fragment"),
    [
        ("SELECT pgjobs_enqueue(NULL)", "task must be"),
        ("SELECT pgjobs_enqueue('')", "task must be"),
        ("SELECT pgjobs_enqueue('t', args => '{}')", "args must be a JSON array"),
        ("SELECT pgjobs_enqueue('t', kwargs => '[]')", "kwargs must be a JSON object"),
        ("SELECT pgjobs_enqueue('t', queue => 'a,b')", "queue must be"),
        ("SELECT pgjobs_enqueue('t', priority => 101)", "priority must be between -100 and 100"),
        ("SELECT pgjobs_enqueue('t', run_at => 'infinity')", "run_at must be a finite time"),
        ("SELECT pgjobs_enqueue('t', idempotency_key => '')", "idempotency_key must be"),
        ("SELECT pgjobs_enqueue('t', max_attempts => 0)", "max_attempts must be"),
    ],
)
def test_pgjobs_enqueue_rejects_bad_input_and_writes_nothing(call_sql: str, fragment: str) -> None:
    with (
        psycopg.connect(dsn(), autocommit=True) as conn,
        pytest.raises(psycopg.errors.InvalidParameterValue, match=fragment),
    ):
        conn.execute(call_sql)
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_pgjobs_enqueue_notifies_at_commit_with_the_queue() -> None:
    with psycopg.connect(dsn(), autocommit=True) as listener, psycopg.connect(dsn()) as writer:
        listener.execute("LISTEN pgjobs")
        writer.execute("SELECT pgjobs_enqueue('t', queue => 'from-sql')")
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []  # not yet committed
        writer.commit()
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == ["from-sql"]
