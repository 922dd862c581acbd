"""The test settings with a second database alias, ``other``, on the same server and
database: an atomic step of a durable job must refuse a write through it (it cannot
commit with the step's transaction on ``default``)."""

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

DATABASES["other"] = {**DATABASES["default"]}
