"""Where the test database comes from (see tests/settings.py)."""

from __future__ import annotations

import os
import sys
import tempfile


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure (no SDK, no engine, no answer): no Docker
        return False


def choose_database_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped]

        container = PostgresContainer("postgres:16", driver=None)
        container.start()  # stopped by testcontainers' reaper when the session ends
        return container.get_connection_url().replace("postgresql://", "postgres://", 1)
    from django_pgjobs.testing.embedded import database_url

    data = os.path.join(tempfile.gettempdir(), f"django-pgjobs-test-pg{sys.version_info[1]}")
    return database_url(data)
