"""The per-minute rollup with real ``runjobs`` processes: two of them count what they
finish once (in-process: tests/db/test_rollup.py)."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgjobs.db.tables import JOB
from tests.helpers.rollup import rolled, truth
from tests.helpers.rows import query


@pytest.mark.process
def test_two_runjobs_processes_count_what_they_finish_once(start_worker: Any) -> None:
    from tests.conftest import wait_until
    from tests.testapp.jobs import add

    workers = [start_worker("--concurrency", "4") for _ in range(2)]
    add.enqueue_many([(i, i) for i in range(400)])
    wait_until(
        lambda: query(f"SELECT count(*) FROM {JOB} WHERE status = 'completed'")[0][0] == 400,
        timeout=60,
        message="all jobs completed",
    )
    # Their maintenance loops (a pass every 5 s each) roll the finishes up, once.
    wait_until(lambda: sum(rolled().values()) == 400, timeout=60, message="400 finishes rolled up")
    assert rolled() == truth()
    for w in workers:
        w.stop()
