"""The test settings for a worker that logs in as one role and works as another
(Django's ``OPTIONS["assume_role"]``: ``SET ROLE`` on each connection): the login
role has no privilege on the job tables, the assumed role has them. The roles are
named by ``PGJOBS_TEST_LOGIN_ROLE`` and ``PGJOBS_TEST_OWNER_ROLE``
(tests/process/test_assume_role.py makes them)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

DATABASES["default"] = {
    **DATABASES["default"],
    "USER": os.environ.get("PGJOBS_TEST_LOGIN_ROLE", "pgjobs_test_login"),
    "PASSWORD": "",
    "OPTIONS": {
        **DATABASES["default"].get("OPTIONS", {}),
        "assume_role": os.environ.get("PGJOBS_TEST_OWNER_ROLE", "pgjobs_test_owner"),
    },
}
