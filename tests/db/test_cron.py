"""Built-in recurring jobs: schedules, system checks, the ticker (injected clock), pgjobs_enqueue."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test import override_settings

from django_pgjobs.checks import check_cron
from django_pgjobs.db.notify import parse_payload
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.definition import make_definition
from django_pgjobs.maintenance import cron as cron_module
from django_pgjobs.maintenance.cron import CronTicker, Schedule, ScheduleError, collect_schedules
from django_pgjobs.maintenance.services import default_services
from django_pgjobs.models import Job
from tests.conftest import dsn
from tests.freeze import frozen_after, in_thread

ADD = "tests.testapp.jobs.add"
T0 = datetime(2024, 5, 1, 10, 30, 0, tzinfo=UTC)


def needs_an_argument(x: int) -> int:
    return x


def nightly() -> None:
    return None


def hourly(name: str = "h", *, at: str = "0 * * * *", **kw: Any) -> Schedule:
    return Schedule(name=name, task=ADD, expression=at, args=[1, 2], **kw)


def errors_for(cron: dict[str, Any], **extra: Any) -> list[Any]:
    with override_settings(PGJOBS={"CRON": cron, **extra}):
        return check_cron()


@pytest.fixture
def temp_job() -> Iterator[Any]:
    """Register module-level functions as jobs for one test only."""
    names: list[str] = []

    def register(func: Any, **options: Any) -> Any:
        definition = make_definition(func, **options)
        registry.register(definition)
        names.append(definition.name)
        return definition

    yield register
    for name in names:
        registry.unregister(name)


# --------------------------------------------------------------------- schedules


def test_valid_entries_load_with_defaults_from_the_task() -> None:
    schedules, problems = collect_schedules(
        {
            "nightly-billing": {
                "task": "tests.testapp.jobs.send_email",
                "schedule": "@daily",
                "args": ["a@example.com"],
                "timezone": "Europe/Paris",
            },
            "tick": {
                "task": ADD,
                "schedule": "*/10 * * * * *",
                "kwargs": {"a": 1, "b": 2},
                "queue": "q",
                "priority": 7,
            },
        }
    )
    assert problems == []
    by_name = {s.name: s for s in schedules}
    billing = by_name["nightly-billing"]
    assert (billing.expression, billing.queue, billing.priority) == ("0 0 * * *", "emails", 5)
    assert by_name["tick"].has_seconds and by_name["tick"].queue == "q"


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"task": ADD, "schedule": "61 * * * *", "args": [1, 2]}, "invalid cron expression"),
        ({"task": ADD, "schedule": "* * *", "args": [1, 2]}, "has 3 fields"),
        ({"task": ADD, "schedule": "@sometimes", "args": [1, 2]}, "unknown alias"),
        ({"task": ADD, "schedule": "0 0 30 2 *", "args": [1, 2]}, "invalid cron expression"),
        (
            {"task": ADD, "schedule": "0 * * * *", "args": [1, 2], "timezone": "Mars/Base"},
            "unknown timezone",
        ),
        ({"task": ADD, "schedule": "0 * * * *", "args": [1]}, "missing a required argument"),
        ({"task": ADD, "schedule": "0 * * * *", "args": [1, 2], "priority": 500}, "priority"),
        ({"task": ADD, "schedule": "0 * * * *", "args": [1, 2], "queu": "x"}, "'queue'"),
        ({"schedule": "0 * * * *"}, "needs a 'task'"),
    ],
)
def test_invalid_entries_are_system_check_errors(entry: dict[str, Any], fragment: str) -> None:
    messages = errors_for({"bad": entry})
    assert [m.id for m in messages] == ["django_pgjobs.E004"], messages
    assert fragment in messages[0].msg and "'bad'" in messages[0].msg


def test_unknown_task_is_E005_with_close_names() -> None:
    messages = errors_for({"x": {"task": "tests.testapp.jobs.ad", "schedule": "0 * * * *"}})
    assert [m.id for m in messages] == ["django_pgjobs.E005"]
    assert "unknown task 'tests.testapp.jobs.ad'" in messages[0].msg
    assert "tests.testapp.jobs.add" in messages[0].msg


def test_bad_schedule_name_is_an_error() -> None:
    messages = errors_for({"_reap": {"task": ADD, "schedule": "0 * * * *", "args": [1, 2]}})
    assert [m.id for m in messages] == ["django_pgjobs.E004"]


def test_catchup_window_not_shorter_than_retention_warns() -> None:
    entry = {"t": {"task": ADD, "schedule": "0 * * * *", "args": [1, 2]}}
    assert errors_for(entry) == []
    messages = errors_for(entry, CRON_CATCHUP_WINDOW=7200, RETENTION={"completed": 3600})
    assert [m.id for m in messages] == ["django_pgjobs.W004"]


def test_job_decorator_cron_is_checked(temp_job: Any) -> None:
    temp_job(needs_an_argument, cron="0 0 * * *")
    temp_job(nightly, cron="0 0 31 2 *")
    messages = check_cron()
    texts = " | ".join(m.msg for m in messages)
    assert {m.id for m in messages} == {"django_pgjobs.E004"} and len(messages) == 2
    assert "called without arguments" in texts and "invalid cron expression" in texts


def test_checks_run_at_startup_and_stop_commands(temp_job: Any) -> None:
    temp_job(nightly, cron="not a cron")
    with pytest.raises(Exception, match="E004"):
        call_command("check")


def test_fire_times_follow_the_timezone_across_dst() -> None:
    paris = Schedule(name="p", task=ADD, expression="30 2 * * *", timezone="Europe/Paris")
    # On 31 March 2024 Paris skips 02:00-03:00; Debian cron semantics run the job at 03:00.
    fires = list(
        paris.fire_times(datetime(2024, 3, 30, tzinfo=UTC), datetime(2024, 4, 1, 12, tzinfo=UTC))
    )
    assert [f.isoformat() for f in fires] == [
        "2024-03-30T01:30:00+00:00",
        "2024-03-31T01:00:00+00:00",
        "2024-04-01T00:30:00+00:00",
    ]
    assert paris.key(fires[0]) == "cron:p:2024-03-30T01:30:00Z"


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


def test_default_services_include_pruner_and_ticker() -> None:
    cron = {"t": {"task": ADD, "schedule": "0 * * * *", "args": [1, 2]}}
    with override_settings(PGJOBS={"CRON": cron}):
        assert [s.name for s in default_services(alias="default", worker="w")] == [
            "reaper",
            "pruner",
            "cron",
            "unknown-tasks",
            "workflow repair",
            "rollup",
            "statistics",
        ]
    with override_settings(PGJOBS={"CRON": cron, "CRON_ENGINE": "pg_cron"}):
        assert [s.name for s in default_services(alias="default", worker="w")] == [
            "reaper",
            "pruner",
            "unknown-tasks",
            "workflow repair",
            "rollup",
            "statistics",
        ]


def test_sync_cron_lists_next_fire_times(capsys: Any) -> None:
    cron = {
        "nightly": {"task": ADD, "schedule": "0 3 * * *", "args": [1, 2], "timezone": "Asia/Tokyo"}
    }
    with override_settings(PGJOBS={"CRON": cron}):
        call_command("sync_cron", "--count", "2")
    out = capsys.readouterr().out
    assert "nightly  [0 3 * * * Asia/Tokyo]" in out
    assert out.count("T03:00:00+09:00") == 2


def test_sync_cron_rejects_bad_schedules_and_lone_flags() -> None:
    with (
        override_settings(PGJOBS={"CRON": {"x": {"task": ADD, "schedule": "nope"}}}),
        pytest.raises(CommandError, match="PGJOBS\\['CRON'\\]\\['x'\\]"),
    ):
        call_command("sync_cron")
    with pytest.raises(CommandError, match="--dry-run needs --pg-cron"):
        call_command("sync_cron", "--dry-run")


def test_schedule_error_carries_its_check_id() -> None:
    assert ScheduleError("x").check_id == "django_pgjobs.E004"


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
