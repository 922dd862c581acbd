"""PgJobsBackend.check(): OPTIONS and QUEUES problems are system-check errors."""

from __future__ import annotations

import pytest

from django_pgjobs.backend import TASKS_AVAILABLE

if not TASKS_AVAILABLE:
    pytest.skip(
        "django.tasks needs Django >= 6.0; only test_import runs on this Django",
        allow_module_level=True,
    )

from django.core.checks import run_checks
from django.tasks import task_backends
from django.test import override_settings

from django_pgjobs.backend import PgJobsBackend


def _backend(**params: object) -> PgJobsBackend:
    return PgJobsBackend(alias="x", params=params)


def test_configured_backends_pass() -> None:
    for alias in ("default", "retrying"):
        assert task_backends[alias].check() == []
    assert [m for m in run_checks() if m.id and m.id.startswith("django_pgjobs.T")] == []


def test_unknown_option_suggests_a_name() -> None:
    (error,) = _backend(OPTIONS={"max_attempt": 3}).check()
    assert error.id == "django_pgjobs.T002" and "Did you mean 'max_attempts'" in error.msg


@pytest.mark.parametrize("value", [0, "3", 1001])
def test_bad_max_attempts(value: object) -> None:
    (error,) = _backend(OPTIONS={"MAX_ATTEMPTS": value}).check()
    assert "max_attempts must be a whole number" in error.msg


def test_bad_queue_name() -> None:
    (error,) = _backend(QUEUES=["ok", "a,b"]).check()
    assert error.id == "django_pgjobs.T003" and "'a,b'" in error.msg


def test_checks_run_through_manage_check() -> None:
    bad = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend", "OPTIONS": {"nope": 1}}}
    with override_settings(TASKS=bad):
        ids = {m.id for m in run_checks()}
    assert "django_pgjobs.T002" in ids
