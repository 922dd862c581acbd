"""The test settings' database before a server is chosen (see tests/dbrig.py).

Django's PostgreSQL backend (so the app's checks see PostgreSQL) that refuses to
connect, saying why: importing the settings must start no server, and a test that
needs the database gets one from tests/conftest.py, which points the settings at it.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base
from django.db.utils import OperationalError


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        raise OperationalError(
            "no test database chosen yet: set DATABASE_URL, or run the tests with pytest "
            "(tests/conftest.py starts a server when a test needs the database)"
        )
