"""Flow control's options, checks and hints, without a database: bad options fail at
decoration, rates parse, E010 names the bad queue entry, unknown tasks say where jobs
must live (the queue rows, claims and plans: tests/db/test_flow.py)."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgjobs import job
from django_pgjobs.checks import check_queues
from django_pgjobs.exceptions import UnknownTask
from django_pgjobs.jobs import registry
from django_pgjobs.queues import parse_rate
from tests import flow_jobs


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"concurrency_limit": 2}, TypeError, "needs a concurrency_key"),
        (
            {"concurrency_key": "u:{user_id}", "concurrency_limit": 0},
            ValueError,
            "concurrency_limit",
        ),
        ({"concurrency_key": "u:{0}"}, ValueError, "not positions"),
        ({"concurrency_key": "u:{nope}"}, ValueError, "'nope', which is not a parameter"),
        ({"concurrency_key": 5}, TypeError, "format string"),
        ({"unique_while": "always"}, ValueError, 'must be "pending" or "active"'),
    ],
)
def test_bad_flow_options_fail_at_decoration(
    options: dict[str, Any], error: type, fragment: str
) -> None:
    def task(user_id: int) -> None: ...

    task.__qualname__ = "bad_flow_task"
    with pytest.raises(error, match=fragment):
        job(**options)(task)
    assert registry.find(f"{__name__}.bad_flow_task") is None


def test_parse_rate() -> None:
    assert parse_rate("5/s") == (5, 1.0) and parse_rate("100/m") == (100, 60.0)
    assert parse_rate("3/h") == (3, 3600.0)
    for bad in ("0/s", "5/d", "5 per second", 5, "1.5/s"):
        with pytest.raises(ValueError, match="rate must be"):
            parse_rate(bad)


@pytest.mark.parametrize(
    ("queues", "fragment"),
    [
        ({"emails": {"max_runing": 2}}, "Did you mean 'max_running'"),
        ({"emails": {"max_running": 0}}, "max_running'] must be a whole number >= 1"),
        ({"emails": {"rate": "10/d"}}, 'must be "N/s", "N/m" or "N/h"'),
        ({"emails": {"paused": "yes"}}, "paused'] must be True or False"),
        ({"emails": 5}, "must be a dict of options"),
        ({"a,b": {}}, "must not contain commas"),
    ],
)
def test_check_e010_names_the_bad_queue_entry(
    settings: Any, queues: dict[str, Any], fragment: str
) -> None:
    settings.PGJOBS = {"QUEUES": queues}
    messages = check_queues()
    assert [m.id for m in messages] == ["django_pgjobs.E010"]
    assert fragment in messages[0].msg


def test_check_e010_accepts_good_entries(settings: Any) -> None:
    settings.PGJOBS = {
        "QUEUES": {"emails": {"max_running": 5, "rate": "100/m"}, "reports": {"paused": True}}
    }
    assert check_queues() == []


def test_unknown_task_error_says_where_jobs_must_live() -> None:
    with pytest.raises(UnknownTask, match=r"jobs` module of every installed app.*JOB_MODULES"):
        registry.get("myapp.tasks.send")


def test_job_modules_that_cannot_be_imported_are_named() -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=r"JOB_MODULES'\] lists 'tests\.nope'"):
        registry.import_job_modules(["tests.nope"])
    assert registry.find(flow_jobs.limited.name) is not None  # loaded by JOB_MODULES
