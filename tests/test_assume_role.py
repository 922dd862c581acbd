"""A worker whose database settings say ``OPTIONS["assume_role"]`` (Django sets the
role on each of its connections): the worker's own connections, made outside
Django (the heartbeat process's, the LISTEN connection), work as the same role."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from django_pgjobs.models import Job, JobResult
from tests import run_records
from tests.conftest import WorkerProcess, wait_until
from tests.settings_role import LOGIN_ROLE, OWNER_ROLE
from tests.test_heartbeat_process import HOLD, STALE_AFTER, TIMINGS
from tests.testapp import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

Start = Callable[..., WorkerProcess]
AS_ROLE = {**TIMINGS, "DJANGO_SETTINGS_MODULE": "tests.settings_role"}


@pytest.fixture
def roles(transactional_db: Any) -> None:
    """A login role without privileges and the role it assumes, which has them all
    (roles belong to the cluster: made once, kept; grants belong to this database)."""
    with connection.cursor() as cursor:
        for role, login in ((OWNER_ROLE, "NOLOGIN"), (LOGIN_ROLE, "LOGIN")):
            cursor.execute(
                f"DO $$ BEGIN CREATE ROLE {role} {login}; "
                "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            )
        cursor.execute(f"GRANT {OWNER_ROLE} TO {LOGIN_ROLE}")
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {OWNER_ROLE}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {OWNER_ROLE}")
        cursor.execute(f"ALTER ROLE {LOGIN_ROLE} NOINHERIT")  # the privileges after SET ROLE only
        cursor.execute(f"SELECT has_table_privilege('{LOGIN_ROLE}', 'django_pgjobs_job', 'UPDATE')")
        assert cursor.fetchone() == (False,)


def test_a_worker_under_assume_role_beats_while_a_job_holds_the_gil(
    roles: None, start_worker: Start
) -> None:
    """The heartbeat process beats for the worker while a job holds the GIL: as the
    login role alone its UPDATE was refused, the job was taken for dead after
    STALE_AFTER and ran again on the other worker."""
    run_records.create()
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {OWNER_ROLE}")
    job = jobs.holds_gil.enqueue("gil", HOLD)
    a = start_worker("--concurrency", "1", env=AS_ROLE)
    wait_until(lambda: Job.objects.get(id=job.id).status != "pending", message="a to claim it")
    b = start_worker("--concurrency", "1", env=AS_ROLE)
    done = wait_until(
        lambda: (row := Job.objects.get(id=job.id)).status in ("completed", "dead") and row,
        timeout=90,
        interval=0.2,
        message="the GIL-holding job to end",
    )
    ran = run_records.runs("gil")
    assert (done.status, done.attempts, done.lease, len(ran)) == ("completed", 1, 1, 1), ran
    assert JobResult.objects.get(job_id=job.id).value > STALE_AFTER
    for worker in (a, b):
        out = worker.output()
        assert "beat failed" not in out and "permission denied" not in out, out
