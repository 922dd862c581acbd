"""System checks and the PGJOBS settings accessor."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from django_pgjobs.checks import check_settings
from django_pgjobs.conf import DEFAULTS, SettingsError, build_settings, get_settings


def _ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_defaults_match_the_spec() -> None:
    conf = build_settings({})
    assert conf.DATABASE == "default"
    assert conf.MAX_ATTEMPTS == 5
    assert (conf.BACKOFF_BASE, conf.BACKOFF_CAP) == (1.0, 3600.0)
    assert (conf.HEARTBEAT_INTERVAL, conf.STALE_AFTER) == (5.0, 30.0)
    assert (conf.POLL_INTERVAL, conf.SHUTDOWN_TIMEOUT) == (1.0, 30.0)
    assert conf.LISTEN is True


def test_durations_accept_numbers_and_timedeltas() -> None:
    conf = build_settings({"STALE_AFTER": timedelta(minutes=1), "HEARTBEAT_INTERVAL": 2})
    assert (conf.STALE_AFTER, conf.HEARTBEAT_INTERVAL) == (60.0, 2.0)


def test_settings_changes_are_seen(settings: Any) -> None:
    settings.PGJOBS = {"MAX_ATTEMPTS": 11}
    assert get_settings().MAX_ATTEMPTS == 11
    settings.PGJOBS = {"MAX_ATTEMPTS": 12}
    assert get_settings().MAX_ATTEMPTS == 12


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"STALE_AFTR": 30}, "Did you mean 'STALE_AFTER'"),
        ({"MAX_ATTEMPTS": "5"}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"POLL_INTERVAL": "1s"}, "POLL_INTERVAL"),
        ({"POLL_INTERVAL": -1}, "positive"),
        ({"LISTEN": "no"}, "LISTEN"),
        ({"RETENTION": {"complete": 3}}, "Did you mean 'completed'"),
    ],
)
def test_bad_values_name_the_key(value: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        build_settings(value)


def test_check_e002_for_bad_settings(settings: Any) -> None:
    settings.PGJOBS = {"HEARTBEAT_INTERVALL": 3}
    messages = check_settings()
    assert _ids(messages) == ["django_pgjobs.E002"]
    assert "HEARTBEAT_INTERVAL" in messages[0].msg


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_check_e001_when_database_is_not_postgresql(settings: Any) -> None:
    settings.DATABASES = {
        **settings.DATABASES,
        "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    }
    settings.PGJOBS = {"DATABASE": "other"}
    assert "django_pgjobs.E001" in _ids(check_settings())
    settings.PGJOBS = {"DATABASE": "missing"}
    assert "django_pgjobs.E001" in _ids(check_settings())


def test_check_e003_stale_after_below_three_heartbeats(settings: Any) -> None:
    settings.PGJOBS = {"HEARTBEAT_INTERVAL": 5, "STALE_AFTER": 14}
    assert "django_pgjobs.E003" in _ids(check_settings())
    settings.PGJOBS = {"HEARTBEAT_INTERVAL": 5, "STALE_AFTER": 15}
    assert "django_pgjobs.E003" not in _ids(check_settings())


def test_every_default_key_is_known() -> None:
    build_settings(dict(DEFAULTS))
