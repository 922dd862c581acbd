"""Test settings plus recurring schedules, for subprocesses in the cron and pg_cron tests.

``PGJOBS_TEST_CRON`` (JSON) replaces the default per-second schedule.
"""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import PGJOBS

PGJOBS = {
    **PGJOBS,
    "CRON_INTERVAL": 0.5,
    "CRON": json.loads(os.environ.get("PGJOBS_TEST_CRON") or "null")
    or {
        "every-second": {
            "task": "tests.testapp.jobs.add",
            "schedule": "* * * * * *",
            "args": [20, 22],
        },
    },
}
