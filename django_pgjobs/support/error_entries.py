"""The entries of ``Job.errors``: what a failed attempt records, built in one place.

An entry is a JSON object with the keys ``attempt`` (the attempt that failed), ``at``
(ISO time), ``type`` (the exception's dotted class name), ``message``, ``traceback``
(``None`` when there is none to give), ``worker`` (the worker's id or ``None``) and,
when the attempt's start is known, ``started_at``. The statements that add entries
in SQL (the reaper's, the unknown-task sweeper's, the repair of exhausted pending
rows) write the same keys, with ``traceback`` null and ``type`` from
``exception_type``.

Every text is made storable first: PostgreSQL's jsonb refuses NUL characters and lone
surrogates, and an entry it refuses fails the write of the outcome (the worker then
dead-letters the job, attempts left or not).
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

#: Characters kept of a message (the start) and of a traceback (the end).
MESSAGE_CHARS = 2_000
TRACEBACK_CHARS = 20_000


def storable(text: Callable[[], object]) -> str:
    """``text()`` as text PostgreSQL can store in jsonb: NUL written as ``\\x00``, a lone
    surrogate as ``\\udXXX``; a ``__str__`` that raises (even ``SystemExit``) or returns
    no text gives ``<unprintable: ...>``."""
    try:
        value = text()
    except BaseException as exc:  # noqa: BLE001 - whatever a user's __str__ raises
        value = f"<unprintable: {type(exc).__name__}>"
    if not isinstance(value, str):
        value = "<unprintable: __str__ returned no text>"
    value = value.replace("\x00", "\\x00")
    if not value.isascii():
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def exception_type(cls: type[BaseException]) -> str:
    """``module.QualifiedName`` of an exception class, storable."""
    return storable(lambda: f"{cls.__module__}.{cls.__qualname__}")


def error_entry(
    attempt: int,
    exc: BaseException,
    worker: str | None,
    started_at: datetime | float | None = None,
    *,
    with_traceback: bool = True,
) -> dict[str, Any]:
    """The entry of ``Job.errors`` for attempt ``attempt`` failing with ``exc``; never
    raises. ``started_at``: when the attempt began, a datetime or epoch seconds (the
    worker takes a float per job and converts it only here; the row keeps only the latest
    claim's start, so this is how the Tasks backend knows when the first attempt
    started). ``with_traceback=False``: a plain entry, for when the full one may be
    what the database refused."""
    entry: dict[str, Any] = {
        "attempt": attempt,
        "at": timezone.now().isoformat(),
        "type": exception_type(type(exc)),
        "message": storable(lambda: str(exc))[:MESSAGE_CHARS],
        "traceback": (
            storable(lambda: "".join(tb.format_exception(exc)))[-TRACEBACK_CHARS:]
            if with_traceback
            else None
        ),
        "worker": None if worker is None else storable(lambda: worker),
    }
    if started_at is not None:
        entry["started_at"] = _moment(started_at).isoformat()
    return entry


def _moment(at: datetime | float) -> datetime:
    """``at`` as ``timezone.now()`` gives a time: aware in UTC under ``USE_TZ``, else
    naive local time."""
    if isinstance(at, datetime):
        return at
    return datetime.fromtimestamp(at, tz=UTC if settings.USE_TZ else None)
