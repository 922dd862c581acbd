"""The management commands that write refuse Django's autocommit off: their writes
would wait in a transaction that nothing commits, and be lost at exit while the
command reported them done (db/readiness.py, ``autocommit_problem``)."""

from __future__ import annotations

from django.core.management.base import CommandError

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness


def require_autocommit(command: str, alias: str | None = None) -> None:
    """``CommandError`` naming the setting when ``alias`` has autocommit off."""
    problem = readiness.autocommit_problem(
        alias or get_settings().DATABASE,
        who=command,
        why="what it writes would wait in a transaction nothing commits, lost at exit",
    )
    if problem is not None:
        raise CommandError(problem.message)
