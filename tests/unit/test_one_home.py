"""Rules that have one home, checked without a database: each is defined once and the
others derive from it (the one that needs the database: tests/db/test_one_home.py)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.dispatch import Signal

from django_pgjobs import signals
from django_pgjobs.conf import DEFAULTS, SETTINGS, PgJobsSettings, Setting, build_settings
from django_pgjobs.health import overview
from django_pgjobs.states import FINISHED, TERMINAL, JobStatus
from django_pgjobs.support.ages import format_age


def test_finished_statuses_come_from_terminal() -> None:
    assert set(FINISHED) == TERMINAL and list(FINISHED) == sorted(FINISHED)
    assert overview.FINISHED_STATUSES == (JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED)


def test_every_setting_is_declared_once() -> None:
    """One declaration per key (conf.PgJobsSettings): the defaults, the parsed object and
    the reference page (tests/unit/test_settings_page.py) all come from it."""
    declared = [name for name, value in vars(PgJobsSettings).items() if isinstance(value, Setting)]
    assert declared == [s.name for s in SETTINGS] == list(DEFAULTS)
    assert build_settings({}).as_dict() == {s.name: s.parse(s.default) for s in SETTINGS}
    assert build_settings({}).MAX_ATTEMPTS == 5


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


def test_one_backoff_for_retries_and_reconnects(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconnect throttle delays with the retries' full-jitter formula, and keeps
    logging at most one line per 10 s of failures."""
    from django_pgjobs.support import retry, throttle

    seen: list[tuple[int, float, float]] = []

    def recording(attempt: int, *, base: float, cap: float) -> float:
        seen.append((attempt, base, cap))
        return retry.backoff(attempt, base=base, cap=cap)

    monkeypatch.setattr(throttle, "backoff", recording)
    reconnect = throttle.Backoff("claim connection")
    delays = []
    for n in range(1, 12):
        reconnect.failed(RuntimeError("down"))
        delays.append(reconnect.delay())
        assert 0 <= delays[-1] <= min(10.0, 0.1 * 2 ** (n - 1))
    assert seen == [(n, 0.1, 10.0) for n in range(1, 12)]
    assert reconnect._suppressed == 10, "one warning for 11 failures within 10 s"
    reconnect.succeeded()
    assert reconnect.failures == 0
