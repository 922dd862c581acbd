"""Parameters for a dedicated psycopg connection made with Django's credentials.

The LISTEN thread, the heartbeat process and the pg_cron sync open their own psycopg
connection (the first blocks waiting for notifications, the second runs without
Django, the last may need another database). Django's ``get_connection_params()``
carries options of its own wrapper that a plain ``psycopg.connect`` must not get;
they are dropped here, in one place. What Django runs on each new connection that
changes what the session may do (``SET ROLE`` for ``OPTIONS["assume_role"]``) is
``session_setup``: without it the heartbeat process's UPDATE was refused to a login
role that holds no privilege of its own, and a job holding the GIL ran twice.
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


def session_setup(alias: str) -> list[str]:
    """The statements a dedicated connection to ``alias`` runs first, as Django's own
    connections do: ``SET ROLE`` when ``OPTIONS["assume_role"]`` names one. (Django's
    session time zone is left out: the dedicated connections read no time as text.)"""
    role = connections[alias].settings_dict.get("OPTIONS", {}).get("assume_role")
    if not role:
        return []
    return ["SET ROLE '" + str(role).replace("'", "''") + "'"]


def set_up_session(conn: Any, alias: str) -> None:
    """Run ``session_setup(alias)`` on ``conn``, committed (a ``SET`` in a transaction
    rolled back later would be undone with it). The heartbeat process, which has no
    Django, runs the same statements from its config."""
    statements = session_setup(alias)
    for statement in statements:
        conn.execute(statement)
    if statements and not conn.autocommit:
        conn.commit()
