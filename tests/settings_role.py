"""The test settings for a worker that logs in as one role and works as another
(Django's ``OPTIONS["assume_role"]``: ``SET ROLE`` on each connection): the login
role has no privilege on the job tables, the assumed role has them
(tests/test_assume_role.py creates both)."""

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

LOGIN_ROLE = "pgjobs_test_login"
OWNER_ROLE = "pgjobs_test_owner"

DATABASES["default"] = {
    **DATABASES["default"],
    "USER": LOGIN_ROLE,
    "PASSWORD": "",
    "OPTIONS": {**DATABASES["default"].get("OPTIONS", {}), "assume_role": OWNER_ROLE},
}
