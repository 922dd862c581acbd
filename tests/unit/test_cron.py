"""Built-in recurring jobs without a database: schedules and their fire times, the system
checks, the commands' refusals (the ticker and pgjobs_enqueue: tests/db/test_cron.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_pgjobs.checks import check_cron
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.definition import make_definition
from django_pgjobs.maintenance.cron import Schedule, ScheduleError, collect_schedules
from django_pgjobs.maintenance.services import default_services

ADD = "tests.testapp.jobs.add"


def needs_an_argument(x: int) -> int:
    return x


def nightly() -> None:
    return None


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


def test_default_services_include_pruner_and_ticker() -> None:
    cron = {"t": {"task": ADD, "schedule": "0 * * * *", "args": [1, 2]}}
    with override_settings(PGJOBS={"CRON": cron}):
        assert [s.name for s in default_services(alias="default", worker="w")] == [
            "reaper",
            "wakes",
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
            "wakes",
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
