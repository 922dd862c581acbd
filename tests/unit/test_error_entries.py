"""The one error-entry builder (``errors.error_entry``): every text it records can be
stored, so a failure is retried as the job says, never dead-lettered because its own
error entry was refused by PostgreSQL (stored for real: tests/db/test_error_entries.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from django_pgjobs.support.error_entries import error_entry, exception_type
from tests.testapp.jobs import FaultSurrogate, FaultUnprintable

KEYS = {"attempt", "at", "type", "message", "traceback", "worker"}


def _storable(entry: dict[str, Any]) -> None:
    text = json.dumps(entry, ensure_ascii=False)
    text.encode("utf-8")  # no lone surrogate anywhere
    assert "\x00" not in text and "\\u0000" not in text


def test_every_text_field_of_an_entry_is_storable() -> None:
    started = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    entry = error_entry(3, FaultSurrogate("bad \x00 and \udc00"), "host\ud800:1", started)
    _storable(entry)
    assert set(entry) == KEYS | {"started_at"}
    assert entry["attempt"] == 3 and entry["started_at"] == started.isoformat()
    assert entry["type"] == "tests.testapp.jobs.FaultSurrogate\\ud800"
    assert entry["message"] == "bad \\x00 and \\udc00"
    assert entry["worker"] == "host\\ud800:1"
    assert "FaultSurrogate\\ud800: bad \\x00 and \\udc00" in entry["traceback"]


def test_a_start_in_epoch_seconds_is_recorded_as_timezone_now_would_have(
    settings: Any,
) -> None:
    """The worker takes each attempt's start as epoch seconds (cheaper than
    ``timezone.now()`` per job) and the entry converts it: aware in UTC under
    ``USE_TZ``, naive local time without it, as ``timezone.now()`` gives."""
    at = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    entry = error_entry(2, RuntimeError("x"), "w", at.timestamp())
    assert entry["started_at"] == "2025-01-02T03:04:05.678901+00:00"
    settings.USE_TZ = False
    naive = error_entry(2, RuntimeError("x"), "w", at.timestamp())["started_at"]
    assert naive == datetime.fromtimestamp(at.timestamp()).isoformat()
    assert "+" not in naive


def test_an_unprintable_exception_still_gives_an_entry() -> None:
    entry = error_entry(1, FaultUnprintable(), None)
    assert entry["message"] == "<unprintable: RuntimeError>" and entry["worker"] is None
    plain = error_entry(
        1, RuntimeError("the outcome could not be written"), "w", with_traceback=False
    )
    assert set(plain) == KEYS and plain["traceback"] is None
    assert plain["type"] == exception_type(RuntimeError) == "builtins.RuntimeError"


def _never_registered() -> None:
    """A module-level function for @job calls that must refuse their name."""


def test_texts_that_name_every_entry_are_storable_too() -> None:
    """The task name and the worker id go into every row and error entry (also those
    written in SQL, which cannot clean them): refused up front, naming what is wrong."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from django_pgjobs import job

    with pytest.raises(ValueError, match=r"task name .* contains a lone surrogate"):
        job(name="tests.bad\udcff")(_never_registered)
    with pytest.raises(ValueError, match=r"task name .* contains a NUL character"):
        job(name="tests.bad\x00")(_never_registered)
    with pytest.raises(CommandError, match=r"--worker-id: contains a lone surrogate"):
        call_command("runjobs", "--worker-id", "host\udcff", "--burst")
    with pytest.raises(CommandError, match=r"--worker-id: must be 1-255 characters, got 300"):
        call_command("runjobs", "--worker-id", "w" * 300, "--burst")
