"""The ``PGJOBS`` settings: defaults, normalisation and a cached accessor.

Every key is optional. Durations accept seconds (int or float) or a ``timedelta``
and are normalised to float seconds here, so the rest of the package never sees a
``timedelta``. Validation that should stop a deploy lives in ``checks.py``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "MAX_ATTEMPTS": 5,
    "BACKOFF_BASE": 1.0,
    "BACKOFF_CAP": 3600.0,
    "HEARTBEAT_INTERVAL": 5.0,
    "STALE_AFTER": 30.0,
    "POLL_INTERVAL": 1.0,
    "BATCH_SIZE": 300,
    "SHUTDOWN_TIMEOUT": 30.0,
    "REAPER_INTERVAL": 10.0,
    "PRUNER_INTERVAL": 300.0,
    "CRON_INTERVAL": 1.0,
    "CRON_CATCHUP_WINDOW": 3600.0,
    "RETENTION": {"completed": 7 * 86400.0, "dead": 30 * 86400.0, "cancelled": 7 * 86400.0},
    "CRON": {},
    "CRON_ENGINE": "builtin",
    "LISTEN": True,
    # Release 0.2 (each key's behaviour is owned by the module named in its comment).
    "PREPARE": "auto",  # sql.hot_cursor: server-side prepared hot statements
    "MAX_ARGS_BYTES": 1_048_576,  # enqueue: encoded args + kwargs of one job
    "MAX_RESULT_BYTES": 1_048_576,  # executor: encoded return value of one job
    "MAX_ERRORS_KEPT": 20,  # outcomes: error entries kept per job (oldest dropped)
    "DEFAULT_TIMEOUT": None,  # executor/worker: seconds a run may take (None: no limit)
    "UNKNOWN_TASK_TIMEOUT": 3600.0,  # worker: dead-letter jobs no live worker knows after this
    "QUEUES": {},  # flow control: name -> {"max_running", "rate", "paused"}
    "JOB_MODULES": [],  # registry: extra modules to import for @job functions
    "METRICS_PORT": None,  # metrics: runjobs serves Prometheus /metrics on this port
}

DURATION_KEYS = frozenset(
    {
        "BACKOFF_BASE",
        "BACKOFF_CAP",
        "HEARTBEAT_INTERVAL",
        "STALE_AFTER",
        "POLL_INTERVAL",
        "SHUTDOWN_TIMEOUT",
        "REAPER_INTERVAL",
        "PRUNER_INTERVAL",
        "CRON_INTERVAL",
        "CRON_CATCHUP_WINDOW",
        "UNKNOWN_TASK_TIMEOUT",
    }
)


class SettingsError(ValueError):
    """A ``PGJOBS`` value has the wrong type or range; the message names the key."""


def to_seconds(value: Any, name: str) -> float:
    """Normalise a duration (number of seconds or ``timedelta``) to float seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingsError(
            f"{name} must be a number of seconds or a timedelta, got {type(value).__name__}"
        )
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingsError(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)


def suggest(name: str, known: list[str] | set[str] | frozenset[str]) -> str:
    """' Did you mean X?' or '' — for error messages about unknown names."""
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


@dataclass(frozen=True)
class PgJobsSettings:
    """The effective settings: ``DEFAULTS`` merged with ``PGJOBS`` and normalised.

    No defaults here: ``DEFAULTS`` is their one home and ``build_settings`` passes
    every key."""

    DATABASE: str
    MAX_ATTEMPTS: int
    BACKOFF_BASE: float
    BACKOFF_CAP: float
    HEARTBEAT_INTERVAL: float
    STALE_AFTER: float
    POLL_INTERVAL: float
    BATCH_SIZE: int
    SHUTDOWN_TIMEOUT: float
    REAPER_INTERVAL: float
    PRUNER_INTERVAL: float
    CRON_INTERVAL: float
    CRON_CATCHUP_WINDOW: float
    RETENTION: dict[str, float | None]
    CRON: dict[str, dict[str, Any]]
    CRON_ENGINE: str
    LISTEN: bool
    PREPARE: bool | str
    MAX_ARGS_BYTES: int
    MAX_RESULT_BYTES: int
    MAX_ERRORS_KEPT: int
    DEFAULT_TIMEOUT: float | None
    UNKNOWN_TASK_TIMEOUT: float
    QUEUES: dict[str, dict[str, Any]]
    JOB_MODULES: list[str]
    METRICS_PORT: int | None


def raw_settings() -> dict[str, Any]:
    value = getattr(django_settings, "PGJOBS", None) or {}
    if not isinstance(value, dict):
        raise SettingsError(f"PGJOBS must be a dict, got {type(value).__name__}")
    return value


def unknown_key_message(key: Any) -> str:
    """``PGJOBS has an unknown key 'x'`` with a suggestion (also for a lowercase key)."""
    text = str(key)
    if text.upper() in DEFAULTS:
        return (
            f"PGJOBS has an unknown key {key!r}: keys are upper case. "
            f"Did you mean {text.upper()!r}?"
        )
    return f"PGJOBS has an unknown key {key!r}.{suggest(text, set(DEFAULTS))}"


def settings_errors(user: dict[str, Any]) -> list[SettingsError]:
    """Every problem at once (the system check reports each): one error per unknown key,
    then one per bad value (each key is validated on its own over the defaults)."""
    errors = [SettingsError(unknown_key_message(k)) for k in user if k not in DEFAULTS]
    for key, value in user.items():
        if key in DEFAULTS:
            try:
                build_settings({key: value})
            except SettingsError as exc:
                errors.append(exc)
    return errors


def build_settings(user: dict[str, Any]) -> PgJobsSettings:
    """Merge ``user`` over the defaults; raise ``SettingsError`` naming the first bad key
    (``settings_errors`` lists them all)."""
    unknown = [k for k in user if k not in DEFAULTS]
    if unknown:
        raise SettingsError(unknown_key_message(unknown[0]))
    merged = {**DEFAULTS, **user}
    out: dict[str, Any] = {}
    for key, value in merged.items():
        name = f"PGJOBS[{key!r}]"
        if key in DURATION_KEYS:
            seconds = to_seconds(value, name)
            if seconds <= 0:
                raise SettingsError(f"{name} must be positive, got {value!r}")
            out[key] = seconds
        elif key in (
            "MAX_ATTEMPTS",
            "BATCH_SIZE",
            "MAX_ARGS_BYTES",
            "MAX_RESULT_BYTES",
            "MAX_ERRORS_KEPT",
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SettingsError(f"{name} must be a whole number >= 1, got {value!r}")
            out[key] = value
        elif key == "DATABASE":
            if not isinstance(value, str) or not value:
                raise SettingsError(f"{name} must be a database alias (str), got {value!r}")
            out[key] = value
        elif key == "LISTEN":
            if not isinstance(value, bool):
                raise SettingsError(f"{name} must be True or False, got {value!r}")
            out[key] = value
        elif key == "PREPARE":
            if not (value == "auto" or isinstance(value, bool)):
                raise SettingsError(f"{name} must be 'auto', True or False, got {value!r}")
            out[key] = value
        elif key == "DEFAULT_TIMEOUT":
            if value is None:
                out[key] = None
            else:
                seconds = to_seconds(value, name)
                if seconds <= 0:
                    raise SettingsError(
                        f"{name} must be positive or None (no limit), got {value!r}"
                    )
                out[key] = seconds
        elif key == "QUEUES":
            # Entries are validated by the flow-control module (system check).
            if not isinstance(value, dict):
                raise SettingsError(f"{name} must be a dict of queue name -> options")
            out[key] = value
        elif key == "JOB_MODULES":
            if (
                isinstance(value, str)
                or not isinstance(value, list | tuple)
                or not all(isinstance(m, str) and m for m in value)
            ):
                raise SettingsError(f"{name} must be a list of module paths, got {value!r}")
            out[key] = list(value)
        elif key == "METRICS_PORT":
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535
            ):
                raise SettingsError(
                    f"{name} must be a port number (0-65535) or None, got {value!r}"
                )
            out[key] = value
        elif key == "RETENTION":
            if not isinstance(value, dict):
                raise SettingsError(f"{name} must be a dict of status -> duration")
            retention = dict(DEFAULTS["RETENTION"])
            for status, dur in value.items():
                if status not in DEFAULTS["RETENTION"]:
                    raise SettingsError(
                        f"{name} has unknown status {status!r}; finished statuses are "
                        f"{sorted(DEFAULTS['RETENTION'])}.{suggest(str(status), set(DEFAULTS['RETENTION']))}"
                    )
                kept = None if dur is None else to_seconds(dur, f"{name}[{status!r}]")
                if kept is not None and kept <= 0:
                    raise SettingsError(
                        f"{name}[{status!r}] must be positive or None (keep forever), got {dur!r}"
                    )
                retention[status] = kept
            out[key] = retention
        elif key == "CRON":
            if not isinstance(value, dict):
                raise SettingsError(f"{name} must be a dict of name -> schedule")
            out[key] = value
        elif key == "CRON_ENGINE":
            # "pg_cron": schedules are installed with sync_cron --pg-cron; runjobs does not tick.
            if value not in ("builtin", "pg_cron"):
                raise SettingsError(f"{name} must be 'builtin' or 'pg_cron', got {value!r}")
            out[key] = value
    return PgJobsSettings(**out)


_cached: PgJobsSettings | None = None


def get_settings() -> PgJobsSettings:
    """The effective settings (cached; cleared when a test overrides ``PGJOBS``)."""
    global _cached
    if _cached is None:
        _cached = build_settings(raw_settings())
    return _cached


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == "PGJOBS":
        _cached = None
