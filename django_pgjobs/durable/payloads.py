"""What a signal or an event carries, checked where it enters: its name, key and
payload, each error naming the argument and what was wrong, before any row is written."""

from __future__ import annotations

from typing import Any

from django_pgjobs.conf import get_settings
from django_pgjobs.support.validation import check_json, check_key, json_bytes, json_text


def check_name(value: Any, what: str) -> str:
    """A signal's or an event's name: 1-255 characters JSON can store."""
    if not isinstance(value, str) or not value or len(value) > 255:
        raise ValueError(
            f"{what} name must be a non-empty string of at most 255 characters, got {value!r}"
        )
    return check_key(value, f"{what} name") or value


def payload_text(value: Any, what: str) -> str | None:
    """The payload as JSON text for its jsonb column (None stays SQL NULL), refused
    when it does not round-trip through JSON or its text exceeds
    ``PGJOBS["MAX_ARGS_BYTES"]``, the bound of a job's arguments."""
    if value is None:
        return None
    check_json(value, f"the {what} payload")
    text = json_text(value)
    size, limit = json_bytes(text), get_settings().MAX_ARGS_BYTES
    if size > limit:
        raise ValueError(
            f"the {what} payload is {size:,} bytes as JSON, more than "
            f"PGJOBS['MAX_ARGS_BYTES'] = {limit:,}; store large data elsewhere and send its key"
        )
    return text
