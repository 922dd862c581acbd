"""How long something took or has waited, as one short word: ``42s``, ``7.5m``, ``3h``.

The one age format of the package: ``jobs_status`` (a column of a plain-text table,
so never a space inside) and the admin (heartbeat age, lag, waited, ran for) both
use it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

_UNITS = ((60.0, 1.0, "s"), (3600.0, 60.0, "m"), (86400.0, 3600.0, "h"))


def format_age(age: float | timedelta | None, *, unknown: str = "—") -> str:
    """``age`` (seconds or a ``timedelta``) in the largest unit below it, one decimal
    (none when it is 0): ``0.4s``, ``42s``, ``7.5m``, ``3h``, ``2.1d``. ``unknown``
    for ``None``; a negative age (clock skew) shows as ``0s``."""
    if age is None:
        return unknown
    seconds = max(age.total_seconds() if isinstance(age, timedelta) else float(age), 0.0)
    value, unit = seconds / 86400.0, "d"
    for limit, size, name in _UNITS:
        if seconds < limit:
            value, unit = seconds / size, name
            break
    text = f"{value:.1f}"
    return (text[:-2] if text.endswith(".0") else text) + unit


def age_since(since: datetime | None, now: datetime | None = None) -> timedelta | None:
    """How long ago ``since`` was (``None`` for ``None``): a heartbeat's, a worker's age."""
    if since is None:
        return None
    return (now or timezone.now()) - since
