"""The test settings with Django's autocommit off (``AUTOCOMMIT = False``), which a
worker refuses (tests/process/test_first_hour.py)."""

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

DATABASES["default"] = {**DATABASES["default"], "AUTOCOMMIT": False}
