"""Rules that have one home: each is defined once and the others derive from it."""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.dispatch import Signal

from django_pgjobs import signals
from django_pgjobs.ages import format_age
from django_pgjobs.conf import DEFAULTS, PgJobsSettings, build_settings
from django_pgjobs.health import overview
from django_pgjobs.pgconn import DJANGO_ONLY, psycopg_params
from django_pgjobs.states import FINISHED, TERMINAL, JobStatus


def test_finished_statuses_come_from_terminal() -> None:
    assert set(FINISHED) == TERMINAL and list(FINISHED) == sorted(FINISHED)
    assert overview.FINISHED_STATUSES == (JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED)


def test_every_setting_has_its_default_in_defaults_only() -> None:
    fields = dataclasses.fields(PgJobsSettings)
    assert {f.name for f in fields} == set(DEFAULTS)
    assert all(f.default is dataclasses.MISSING for f in fields), "defaults live in DEFAULTS"
    assert dataclasses.asdict(build_settings({}))["MAX_ATTEMPTS"] == DEFAULTS["MAX_ATTEMPTS"]


@pytest.mark.parametrize(
    ("age", "text"),
    [
        (None, "—"),
        (0.4, "0.4s"),
        (42, "42s"),
        (timedelta(minutes=7, seconds=30), "7.5m"),
        (3600, "1h"),
        (timedelta(days=2, hours=2, minutes=24), "2.1d"),
        (-3, "0s"),
    ],
)
def test_one_age_format(age: Any, text: str) -> None:
    assert format_age(age) == text
    assert " " not in format_age(age), "a column of jobs_status: never a space inside"


@pytest.mark.django_db
def test_dedicated_connections_drop_only_djangos_own_options() -> None:
    params = psycopg_params("default", application_name="pgjobs-test")
    assert not set(DJANGO_ONLY) & set(params)
    assert "prepare_threshold" in params, "Django's choice (None: poolers) is kept"
    with psycopg.connect(**params, autocommit=True) as conn:
        row = conn.execute("SHOW application_name").fetchone()
    assert row == ("pgjobs-test",)


def test_signals_send_logs_a_raising_receiver_with_any_sender(caplog: Any) -> None:
    signal = Signal()
    seen: list[Any] = []

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    def fine(sender: Any, **kwargs: Any) -> None:
        seen.append((sender, kwargs["task_result"]))

    signal.connect(broken, weak=False)
    signal.connect(fine, weak=False)
    with caplog.at_level(logging.ERROR, logger="django_pgjobs"):
        signals.send(signal, int, task_result="r")
    assert seen == [(int, "r")], "the next receiver still runs"
    assert any("receiver bug" in r.getMessage() for r in caplog.records)
