"""One bad schedule never stops the others: a name too long for
the idempotency key is a system-check error, and the ticker isolates failures."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import override_settings

from django_pgjobs.checks import check_cron
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.definition import make_definition
from django_pgjobs.maintenance.cron import MAX_KEYED_NAME, CronTicker, Schedule
from django_pgjobs.maintenance.services import default_services
from django_pgjobs.models import Job

ADD = "tests.testapp.jobs.add"
T0 = datetime(2024, 5, 1, 10, 30, 0, tzinfo=UTC)
LONG = "a" * (MAX_KEYED_NAME + 1)


def nightly() -> None:
    return None


@pytest.fixture
def long_named_cron_job() -> Iterator[Any]:
    definition = make_definition(nightly, name=LONG, cron="* * * * *")
    registry.register(definition)
    yield definition
    registry.unregister(definition.name)


def test_a_cron_name_too_long_for_the_key_is_a_check_error(long_named_cron_job: Any) -> None:
    assert MAX_KEYED_NAME == 229
    with override_settings(PGJOBS={}):
        messages = check_cron()
    assert [m.id for m in messages] == ["django_pgjobs.E004"]
    assert (
        "at most 229" in messages[0].msg and f"{MAX_KEYED_NAME + 1} characters" in messages[0].msg
    )


def test_a_worker_still_ticks_the_other_schedules(long_named_cron_job: Any) -> None:
    good = {"good": {"task": ADD, "schedule": "* * * * *", "args": [1, 2]}}
    with override_settings(PGJOBS={"CRON": good}):
        tickers = [
            s for s in default_services(alias="default", worker="w") if isinstance(s, CronTicker)
        ]
    assert [[s.name for s in t.schedules] for t in tickers] == [["good"]]


@pytest.mark.django_db
def test_the_ticker_isolates_a_failing_schedule() -> None:
    # Schedules built by hand skip validation: the bad one sorts first and its key
    # does not fit the column ("value too long"), as in the issue.
    bad = Schedule(name="0" + "z" * 240, task=ADD, expression="* * * * *", args=[1, 2])
    good = Schedule(name="good", task=ADD, expression="* * * * *", args=[3, 4])
    ticker = CronTicker(schedules=[bad, good])
    assert ticker.run_once(now=T0) == {"due": 2, "inserted": 1, "existing": 0, "failed": 1}
    assert list(Job.objects.values_list("idempotency_key", flat=True)) == [
        "cron:good:2024-05-01T10:30:00Z"
    ]
