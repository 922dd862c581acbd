"""Parameters for a dedicated psycopg connection made with Django's credentials.

The LISTEN thread and the pg_cron sync open their own psycopg connection (one
blocks waiting for notifications, the other may need another database). Django's
``get_connection_params()`` carries options of its own wrapper that a plain
``psycopg.connect`` must not get; they are dropped here, in one place.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

#: Keys of Django's connection parameters that only its own wrapper understands (its
#: cursor class, its adapters context, server-side binding). ``prepare_threshold`` is
#: kept: Django sets it to None (no prepared statements, for connection poolers)
#: unless ``OPTIONS`` says otherwise, and a dedicated connection should do the same.
DJANGO_ONLY = ("cursor_factory", "context", "server_side_binding")


def psycopg_params(alias: str, **changes: Any) -> dict[str, Any]:
    """``psycopg.connect(**psycopg_params(alias))`` reaches the database of ``alias``
    as Django does; ``changes`` override keys (``dbname=...``)."""
    params = dict(connections[alias].get_connection_params())
    for key in DJANGO_ONLY:
        params.pop(key, None)
    params.update(changes)
    return params
