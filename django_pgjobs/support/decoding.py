"""Stored JSON decoded as hostile input: a value that cannot be decoded becomes an
``Undecodable`` placeholder for its own row, never an exception for a batch or a page.

Anyone with INSERT rights (psql, ``pgjobs_enqueue`` before it bounded its input, an
old version) can store JSON that PostgreSQL accepts and ``json.loads`` does not:
a number of more than 4,300 digits (``ValueError``), nesting deeper than the
interpreter's recursion limit (``RecursionError``). Decoded where a whole claim
batch, list page or status report is read, one such row used to fail them all.
"""

from __future__ import annotations

import json
from typing import Any


class Undecodable(str):
    """Stands in for a stored JSON value that cannot be decoded; its text (the
    reason, e.g. ``"<undecodable: RecursionError>"``) is what pages and errors show."""

    reason: str


def undecodable(exc: BaseException) -> Undecodable:
    placeholder = Undecodable(f"<undecodable: {type(exc).__name__}>")
    try:
        detail = str(exc)[:300]
    except Exception:  # noqa: BLE001 - the reason is a courtesy
        detail = ""
    placeholder.reason = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return placeholder


#: Deeper nesting is refused as if decoding had hit the recursion limit. Python 3.11's
#: decoder raises RecursionError near 1,000 levels; 3.12+ decodes far deeper, and the
#: value then breaks whatever walks it later (a repr, a template, json.dumps) with the
#: same error, outside any per-row guard. One bound on every Python.
MAX_DEPTH = 500


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists/dicts more than ``limit`` deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, list | dict))
    return False


def bounded(text: str | bytes, value: Any) -> Any:
    """``value`` (decoded from ``text``), or a placeholder when it nests deeper than
    ``MAX_DEPTH``. Counting brackets is cheap; only a text with that many can nest
    that deep, so the common value is never walked."""
    if isinstance(text, str):
        opens = text.count("[") + text.count("{")
    else:
        opens = text.count(b"[") + text.count(b"{")
    if opens > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        return undecodable(RecursionError(f"nesting deeper than {MAX_DEPTH} levels"))
    return value


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``, or an ``Undecodable`` placeholder when it fails or nests
    deeper than ``MAX_DEPTH``."""
    try:
        return bounded(text, json.loads(text))
    except (ValueError, RecursionError, MemoryError) as exc:
        return undecodable(exc)


def as_text(value: Any, limit: int = 200) -> str:
    """``value`` as at most ``limit`` characters of text, whatever it holds."""
    if isinstance(value, str):
        return value[:limit]
    try:
        return json.dumps(value)[:limit]
    except (ValueError, TypeError, RecursionError):
        return f"<{type(value).__name__}>"
