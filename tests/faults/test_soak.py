"""Long soaks (marker ``soak``, not run in CI). Run them with

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/soak \\
        python -m pytest tests/faults -m soak -p no:cacheprovider

Sizes come from the environment: PGJOBS_SOAK_JOBS (default 100,000) and
PGJOBS_SOAK_FAULTS (default 20 rounds of kill-a-worker / restart-the-server).
"""

from __future__ import annotations

import os
import random
import time

import psycopg
import pytest

from tests.conftest import wait_until
from tests.faults.conftest import DBNAME, Workers, sigkill, status_counts

pytestmark = pytest.mark.soak

COUNT = "tests.testapp.jobs.fault_count"


def test_soak_drain_under_kills_and_restarts(db, workers: Workers, cluster) -> None:
    total = int(os.environ.get("PGJOBS_SOAK_JOBS", "100000"))
    rounds = int(os.environ.get("PGJOBS_SOAK_FAULTS", "20"))
    db.execute(
        "INSERT INTO django_pgjobs_job (task, args, kwargs, max_attempts, queue, priority)"
        " SELECT %s, '[]', '{}', 25, 'q' || (g %% 4), (g %% 7) - 3"
        " FROM generate_series(1, %s) g",
        [COUNT, total],
    )
    live = [workers.start("--concurrency", "4", "--batch", "20") for _ in range(3)]
    rng = random.Random(1)
    for _ in range(rounds):
        time.sleep(rng.uniform(1, 4))
        if rng.random() < 0.5:
            victim = live.pop(rng.randrange(len(live)))
            sigkill(victim)
            live.append(workers.start("--concurrency", "4", "--batch", "20"))
        else:
            cluster.restart()
    with psycopg.connect(cluster.dsn(DBNAME), autocommit=True) as conn:
        wait_until(
            lambda: status_counts(conn) == {"completed": total},
            timeout=3600,
            interval=2,
            message="every job completed",
        )
        # Every job ran at least once; more runs only where an attempt was cut off.
        assert (
            conn.execute(
                "SELECT count(*) FROM (SELECT j.id, j.attempts, count(e.id) n"
                " FROM django_pgjobs_job j LEFT JOIN fault_effects e ON e.job_id = j.id"
                " GROUP BY j.id) x WHERE n < 1 OR n > attempts"
            ).fetchone()[0]
            == 0
        )
    assert "deadlock detected" not in cluster.server_log()
