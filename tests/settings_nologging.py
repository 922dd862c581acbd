"""The test settings without a LOGGING setting: a project that configured nothing."""

from tests.settings import *  # noqa: F403

LOGGING: dict[str, object] = {}
