"""The test settings with ``USE_TZ = False``: a project that keeps naive times."""

from tests.settings import *  # noqa: F403

USE_TZ = False
