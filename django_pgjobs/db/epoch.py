"""Times that cross the wire as epoch microseconds (a bigint) instead of timestamptz.

Django's timestamptz loader parses text in Python (a third of a worker's CPU per
claim, when the claim returned ``run_at`` itself), and under ``USE_TZ = False`` it
returns naive times, while a NOTIFY's payload carries aware ones. A bigint decodes in
C and ``from_epoch_us`` makes it an aware UTC time whatever the project's settings;
callers that hand a time to the ORM's world convert it there (``jobs/enqueue.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_us(sql: str) -> str:
    """The SQL of ``sql`` (a timestamptz) as epoch microseconds; NULL when infinite
    (the cast would raise, and one row's run_at must not fail a whole claim)."""
    return f"CASE WHEN isfinite({sql}) THEN (extract(epoch FROM {sql}) * 1000000)::bigint END"


def from_epoch_us(microseconds: int | None) -> datetime | None:
    """An ``epoch_us`` value as an aware UTC time (None: infinite, or before year 1,
    which no datetime holds)."""
    if microseconds is None:
        return None
    try:
        return _EPOCH + timedelta(microseconds=microseconds)
    except OverflowError:
        return None
