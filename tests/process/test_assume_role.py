"""A worker whose database settings say ``OPTIONS["assume_role"]`` (Django sets the
role on each of its connections): the worker's own connections, made outside
Django (the heartbeat process's, the LISTEN connection), work as the same role."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from django_pgjobs.models import Job, JobResult
from tests.conftest import WorkerProcess, wait_until
from tests.helpers import run_records
from tests.helpers.heartbeat import HOLD, STALE_AFTER, TIMINGS
from tests.testapp import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

Start = Callable[..., WorkerProcess]


def _drop(cursor: Any, *roles: str) -> None:
    for role in roles:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cursor.fetchone():
            cursor.execute(f'DROP OWNED BY "{role}"')  # its grants in this database
            cursor.execute(f'DROP ROLE "{role}"')


@pytest.fixture
def roles(transactional_db: Any) -> Iterator[tuple[str, str]]:
    """A login role without privileges and the role it assumes, which has them all;
    named after this test database (roles belong to the cluster, which CI's legs
    share), dropped afterwards."""
    name = connection.settings_dict["NAME"].lower()[:40]
    owner, login = f"{name}_owner", f"{name}_login"
    with connection.cursor() as cursor:
        _drop(cursor, login, owner)  # left by a run that was killed
        cursor.execute(f'CREATE ROLE "{owner}" NOLOGIN')
        # NOINHERIT: the privileges only after SET ROLE
        cursor.execute(f'CREATE ROLE "{login}" LOGIN NOINHERIT IN ROLE "{owner}"')
        cursor.execute("SELECT has_table_privilege(%s, 'django_pgjobs_job', 'UPDATE')", [login])
        assert cursor.fetchone() == (False,)
    yield owner, login
    with connection.cursor() as cursor:
        _drop(cursor, login, owner)


def test_a_worker_under_assume_role_beats_while_a_job_holds_the_gil(
    roles: tuple[str, str], start_worker: Start
) -> None:
    """The heartbeat process beats for the worker while a job holds the GIL: as the
    login role alone its UPDATE was refused, the job was taken for dead after
    STALE_AFTER and ran again on the other worker."""
    owner, login = roles
    run_records.create()
    with connection.cursor() as cursor:
        cursor.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{owner}"')
        cursor.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{owner}"')
    env = {
        **TIMINGS,
        "DJANGO_SETTINGS_MODULE": "tests.settings_role",
        "PGJOBS_TEST_LOGIN_ROLE": login,
        "PGJOBS_TEST_OWNER_ROLE": owner,
    }
    job = jobs.holds_gil.enqueue("gil", HOLD)
    a = start_worker("--concurrency", "1", env=env)
    wait_until(lambda: Job.objects.get(id=job.id).status != "pending", message="a to claim it")
    b = start_worker("--concurrency", "1", env=env)
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
