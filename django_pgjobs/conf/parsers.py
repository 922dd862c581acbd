"""The value parsers of the ``PGJOBS`` keys and the environment variables (``conf/__init__.py``).

A parser checks one value and normalises it (a duration becomes float seconds), and
knows how the reference page names its type and shows its default, so the page's
table is made from the same object that does the checking. Every error is a
``SettingsError`` that names the key and says what was wrong.
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
    """A ``PGJOBS`` value (or an environment variable) has the wrong type or range; the
    message names the key."""


def suggest(name: str, known: list[str] | set[str] | frozenset[str]) -> str:
    """' Did you mean X?' or '' — for error messages about unknown names."""
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def literal(value: Any) -> str:
    """A default as the reference page shows it: ``"default"``, ``5``, ``None``, ``{}``."""
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list | dict):
        return f"`{json.dumps(value)}`"
    return f"`{value!r}`"


@dataclass(frozen=True)
class Parser(Generic[T]):
    """``parse(value, name)``: the normalised value, or ``SettingsError`` naming ``name``."""

    kind: str  # the page's "Type" column
    parse: Callable[[Any, str], T]
    show: Callable[[Any], str] = literal  # the page's "Default" column


def seconds(value: Any, name: str) -> float:
    """A number of seconds (int, float or ``timedelta``) as float seconds, finite."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingsError(
            f"{name} must be a number of seconds or a timedelta, got {type(value).__name__}"
        )
    if not math.isfinite(value):
        raise SettingsError(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)


def _positive_seconds(value: Any, name: str, none_means: str = "") -> float:
    result = seconds(value, name)
    if result <= 0:
        alternative = f" or None ({none_means})" if none_means else ""
        raise SettingsError(f"{name} must be positive{alternative}, got {value!r}")
    return result


def _show_seconds(value: Any) -> str:
    return "`None`" if value is None else f"`{value:g}` s"


duration: Parser[float] = Parser("duration", _positive_seconds, _show_seconds)


def _optional_duration(value: Any, name: str) -> float | None:
    return None if value is None else _positive_seconds(value, name, "no limit")


optional_duration: Parser[float | None] = Parser(
    "duration or `None`", _optional_duration, _show_seconds
)


def _whole(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingsError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


whole: Parser[int] = Parser("`int` ≥ 1", _whole)


def _alias(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise SettingsError(f"{name} must be a database alias (str), got {value!r}")
    return value


alias: Parser[str] = Parser("`str` (alias)", _alias)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise SettingsError(f"{name} must be True or False, got {value!r}")
    return value


flag: Parser[bool] = Parser("`bool`", _flag)


def choice(*allowed: T) -> Parser[T]:
    """One of ``allowed``, compared with its type (``1`` is not ``True``)."""
    spoken = ", ".join(repr(a) for a in allowed[:-1]) + f" or {allowed[-1]!r}"
    shown = ", ".join(literal(a) for a in allowed[:-1]) + f" or {literal(allowed[-1])}"

    def parse(value: Any, name: str) -> T:
        for option in allowed:
            if type(value) is type(option) and value == option:
                return option
        raise SettingsError(f"{name} must be {spoken}, got {value!r}")

    return Parser(shown, parse)


def mapping(of: str, kind: str) -> Parser[dict[str, dict[str, Any]]]:
    """A dict whose entries another module checks (``CRON``: E004/E005, ``QUEUES``: E010)."""

    def parse(value: Any, name: str) -> dict[str, dict[str, Any]]:
        if not isinstance(value, dict):
            raise SettingsError(f"{name} must be a dict of {of}")
        return value

    return Parser(kind, parse)


def _module_list(value: Any, name: str) -> list[str]:
    if (
        isinstance(value, str)
        or not isinstance(value, list | tuple)
        or not all(isinstance(m, str) and m for m in value)
    ):
        raise SettingsError(f"{name} must be a list of module paths, got {value!r}")
    return list(value)


module_list: Parser[list[str]] = Parser("`list` of module paths", _module_list)


def _optional_port(value: Any, name: str) -> int | None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535
    ):
        raise SettingsError(f"{name} must be a port number (0-65535) or None, got {value!r}")
    return value


optional_port: Parser[int | None] = Parser("`int` or `None`", _optional_port)


def _listen_address(value: Any, name: str) -> str:
    """An address to listen on: an IPv4 or IPv6 literal, or a host name."""
    if isinstance(value, str) and value:
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(value))
        if re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", value):
            return value
    raise SettingsError(
        f"{name} must be an address to listen on, such as 127.0.0.1, 0.0.0.0, :: or "
        f"a host name, got {value!r}"
    )


listen_address: Parser[str] = Parser("`str` (address)", _listen_address)


def retention(defaults: Mapping[str, float | None]) -> Parser[dict[str, float | None]]:
    """Status -> seconds kept (``None``: for ever); a status left out keeps its default."""

    def parse(value: Any, name: str) -> dict[str, float | None]:
        if not isinstance(value, dict):
            raise SettingsError(f"{name} must be a dict of status -> duration")
        kept = dict(defaults)
        for status, dur in value.items():
            if status not in defaults:
                raise SettingsError(
                    f"{name} has unknown status {status!r}; finished statuses are "
                    f"{sorted(defaults)}.{suggest(str(status), set(defaults))}"
                )
            where = f"{name}[{status!r}]"
            kept[status] = None if dur is None else _positive_seconds(dur, where, "keep forever")
        return kept

    def show(value: Any) -> str:
        days = ", ".join(f'"{k}": {v / 86400:g} days' for k, v in value.items())
        return f"`{{{days}}}`"

    return Parser("`dict` status → duration or `None`", parse, show)


def _interval_text(value: Any, name: str) -> float:
    """An environment variable's seconds: at least 0.1 (a smaller one would spin)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0.1:
        raise SettingsError(
            f"{name} must be a number of seconds of at least 0.1, such as 10 or 2.5, got {value!r}"
        )
    return number


interval_text: Parser[float] = Parser("seconds ≥ 0.1", _interval_text, lambda v: f"`{v}`")
