"""The test settings behind Django's own connection pool (``OPTIONS["pool"]``), sized
as a web process might: psycopg_pool's default of 4 connections, and a short wait for
one (2 s instead of 30) so that a starved thread fails fast. ``PGJOBS_TEST_POOL_MAX``
sets ``max_size``."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

_pool: dict[str, float] = {"timeout": 2.0}
if os.environ.get("PGJOBS_TEST_POOL_MAX"):
    _pool["max_size"] = int(os.environ["PGJOBS_TEST_POOL_MAX"])
DATABASES["default"] = {
    **DATABASES["default"],
    "CONN_MAX_AGE": 0,  # Django refuses persistent connections with a pool
    "OPTIONS": {**DATABASES["default"].get("OPTIONS", {}), "pool": _pool},
}
