"""Where the test database comes from (see tests/settings.py).

Nothing here runs at import. With ``DATABASE_URL`` set, the settings use it at once;
without it they name no server, and ``use_chosen_database`` (called by the
``django_db_modify_db_settings`` fixture in tests/conftest.py, just before
pytest-django creates the test database) picks one then. So tools that only import
the settings (mypy's Django plugin, ``makemigrations --check``) start nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Any

#: The ENGINE of the settings before a server is chosen: PostgreSQL that refuses to
#: connect, saying why (tests/unchosen_postgresql).
UNCHOSEN_ENGINE = "tests.unchosen_postgresql"


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure (no SDK, no engine, no answer): no Docker
        return False


def choose_database_url() -> str:
    """``DATABASE_URL``, else a testcontainers PostgreSQL, else the embedded server
    (both started here)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16", driver=None)
        container.start()  # stopped by testcontainers' reaper when the session ends
        return container.get_connection_url().replace("postgresql://", "postgres://", 1)
    from django_pgjobs.testing.embedded import database_url

    data = os.path.join(tempfile.gettempdir(), f"django-pgjobs-test-pg{sys.version_info[1]}")
    return database_url(data)


def database_config(url: str) -> dict[str, Any]:
    """The ``DATABASES["default"]`` entry for ``url``, with the suite's options."""
    import environ

    config: dict[str, Any] = environ.Env.db_url_config(url)
    if os.environ.get("PGJOBS_TEST_SERVER_SIDE_BINDING") == "1":
        # Django's psycopg 3 options that make psycopg prepare repeated statements (as
        # the benchmark does); CI runs one leg of the suite with them.
        config["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}
    if os.environ.get("PGJOBS_WORKER_DB_NAME"):
        # A runjobs subprocess started by a test: use the test database as is.
        config["NAME"] = os.environ["PGJOBS_WORKER_DB_NAME"]
    return config


def use_chosen_database() -> None:
    """Choose the server now if the settings have none yet, and export its URL as
    ``DATABASE_URL`` so that ``runjobs`` subprocesses started by tests use it too."""
    from django.conf import settings
    from django.db import connections

    default = settings.DATABASES["default"]
    if default.get("ENGINE") != UNCHOSEN_ENGINE:
        return
    url = choose_database_url()
    os.environ["DATABASE_URL"] = url
    # In place: Django's connection handler holds this very dict (with the defaults
    # it filled in, such as TEST), so it sees the new server.
    default.update(database_config(url))
    with contextlib.suppress(AttributeError):  # a wrapper made before: remake it
        del connections["default"]
