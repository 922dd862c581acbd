"""Text from rows, made safe for terminals and log lines.

Queue names, task names, worker ids and error messages come from rows that anyone
with INSERT rights (or ``pgjobs_enqueue``) can write. A control character in one
would reach an operator's terminal (``jobs_status``: ``esc\\x1b[31mRED`` recolours
it) or split a log line in two (a forged second line). ``printable`` escapes such
characters the way ``repr`` does; ``EscapeControlCharacters`` applies it to every
argument of every record of the ``django_pgjobs`` logger.
"""

from __future__ import annotations

import logging
from typing import Any

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with control, format and separator characters (newlines, ESC, bidi
    overrides...) escaped as ``\\xNN`` / ``\\uNNNN``; plain text comes back as is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


class _Escaped:
    """An argument that prints escaped with ``%s`` and as itself with ``%r``."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __str__(self) -> str:
        return printable(str(self.value))

    def __repr__(self) -> str:
        return printable(repr(self.value))


def _safe(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return _Escaped(value)


class EscapeControlCharacters(logging.Filter):
    """Escape control characters in the arguments of a log record (never drops it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, dict):
            record.args = {k: _safe(v) for k, v in record.args.items()}
        elif record.args:
            record.args = tuple(_safe(a) for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = printable(record.msg)
        return True


def install(logger_name: str = "django_pgjobs") -> None:
    """Add the filter to the package's logger (once)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, EscapeControlCharacters) for f in logger.filters):
        logger.addFilter(EscapeControlCharacters())
