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


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "0.01", ""])
def test_a_bad_environment_variable_is_e002_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from django_pgjobs.health.queue_stats import QueueStatsRefresher

    monkeypatch.setenv("PGJOBS_METRICS_INTERVAL", value)
    messages = check_settings()
    assert _ids(messages) == ["django_pgjobs.E002"]
    assert messages[0].msg == (
        "the environment variable PGJOBS_METRICS_INTERVAL must be a number of seconds of "
        f"at least 0.1, such as 10 or 2.5, got {value!r}"
    )
    with pytest.raises(SettingsError, match="PGJOBS_METRICS_INTERVAL"):
        QueueStatsRefresher(target=None)  # read when a worker starts its metrics, not at import


def test_a_good_environment_variable_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_pgjobs.health.queue_stats import QueueStatsRefresher

    monkeypatch.setenv("PGJOBS_METRICS_INTERVAL", "2.5")
    assert check_settings() == []
    assert QueueStatsRefresher(target=None).interval == 2.5
    monkeypatch.delenv("PGJOBS_METRICS_INTERVAL")
    assert QueueStatsRefresher(target=None).interval == 10.0


def test_every_bad_key_is_reported_at_once(settings: Any) -> None:
    settings.PGJOBS = {"stale_after": 1, "MAX_ATTEMPTS": 0, "CRON_ENGINE": "cron", "LISTEN": 1}
    assert [m.msg for m in check_settings()] == [
        "PGJOBS has an unknown key 'stale_after': keys are upper case. Did you mean 'STALE_AFTER'?",
        "PGJOBS['MAX_ATTEMPTS'] must be a whole number >= 1, got 0",
        "PGJOBS['CRON_ENGINE'] must be 'builtin' or 'pg_cron', got 'cron'",
        "PGJOBS['LISTEN'] must be True or False, got 1",
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"PREPARE": 1}, "PGJOBS['PREPARE'] must be 'auto', True or False, got 1"),
        (
            {"DEFAULT_TIMEOUT": 0},
            "PGJOBS['DEFAULT_TIMEOUT'] must be positive or None (no limit), got 0",
        ),
        (
            {"RETENTION": {"dead": -1}},
            "PGJOBS['RETENTION']['dead'] must be positive or None (keep forever), got -1",
        ),
        (
            {"METRICS_PORT": 70000},
            "PGJOBS['METRICS_PORT'] must be a port number (0-65535) or None, got 70000",
        ),
        ({"JOB_MODULES": "a.b"}, "PGJOBS['JOB_MODULES'] must be a list of module paths, got 'a.b'"),
        ({"QUEUES": []}, "PGJOBS['QUEUES'] must be a dict of queue name -> options"),
        (
            {"STALE_AFTER": float("inf")},
            "PGJOBS['STALE_AFTER'] must be a finite number of seconds, got inf",
        ),
        ({"DATABASE": ""}, "PGJOBS['DATABASE'] must be a database alias (str), got ''"),
    ],
)
def test_messages_of_each_parser(value: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        build_settings(value)
    assert str(caught.value) == message


def test_the_settings_object_is_read_only_and_typed() -> None:
    conf = build_settings({"RETENTION": {"dead": None}, "PREPARE": False})
    assert conf.RETENTION == {"completed": 7 * 86400.0, "dead": None, "cancelled": 7 * 86400.0}
    assert conf.PREPARE is False and conf.JOB_MODULES == [] and conf.DEFAULT_TIMEOUT is None
    with pytest.raises(AttributeError, match="read-only"):
        conf.MAX_ATTEMPTS = 3  # type: ignore[misc]


def test_the_package_reads_the_environment_only_through_declared_variables() -> None:
    """Every environment variable the package reads is declared in conf.ENVIRONMENT,
    so check E002 validates it with a message naming it. The other uses: a default
    for the embedded server's library (it reads nothing), and the pipe a worker hands
    the child that runs a suspect alone (set by the worker itself, never by a user)."""
    import ast
    from pathlib import Path

    import django_pgjobs
    from django_pgjobs.conf import ENVIRONMENT

    root = Path(django_pgjobs.__file__).parent
    uses = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node) if isinstance(node, ast.Call | ast.Subscript) else ""
            if text.startswith(("os.environ", "os.getenv", "environ.", "getenv(")):
                uses.append((str(path.relative_to(root)), text))
    assert uses == [
        ("conf/__init__.py", "os.environ.get(self.name, self.default)"),
        ("testing/embedded.py", "os.environ.setdefault('PGSERVER_POSTGRES_VERSION', '16')"),
        ("worker/isolated.py", "os.environ.pop(LIFELINE_ENV)"),
    ]
    assert [v.name for v in ENVIRONMENT] == ["PGJOBS_METRICS_INTERVAL"]
    for variable in ENVIRONMENT:
        with pytest.raises(SettingsError, match=variable.name):
            variable.parser.parse("not a value", f"the environment variable {variable.name}")
