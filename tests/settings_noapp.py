"""The test settings with "django_pgjobs" forgotten in INSTALLED_APPS."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in ("django_pgjobs", "tests.tasks_backend")]
