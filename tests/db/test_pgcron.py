"""The pg_cron engine against a real PostgreSQL with pg_cron preloaded (a throwaway cluster).

pg_cron 1.4 (Debian bookworm's postgresql-15-cron) fires at most once a minute, so
the end-to-end test waits for one minute boundary (at most ~60 s) and checks
everything that must happen at it: the schedule's job, the reaper and the pruner.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.conftest import ROOT, wait_until
from tests.helpers.cluster import TempCluster, pg_bindir

ADD = "tests.testapp.jobs.add"


def pg_cron_missing() -> str | None:
    bindir = pg_bindir()
    if bindir is None:
        return "no PostgreSQL server binaries on this machine"
    lib = bindir.parent / "lib" / "pg_cron.so"
    if not lib.exists():
        major = bindir.parent.name
        return f"pg_cron is not installed ({lib} missing; apt-get install postgresql-{major}-cron)"
    return None


@pytest.fixture(scope="module")
def cluster() -> Iterator[TempCluster]:
    reason = pg_cron_missing()
    if reason:
        print(f"SKIP pg_cron tests: {reason}")
        pytest.skip(reason)
    cluster = TempCluster(
        name="pgjobs-cron",
        conf={
            "shared_preload_libraries": "'pg_cron'",
            "cron.database_name": "'postgres'",
            "cron.host": "'127.0.0.1'",
        },
    ).start()
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_cron")
        cluster.create_database("app")
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def cron_cluster(cluster: TempCluster) -> Iterator[TempCluster]:
    """The cluster, with every ``pgjobs:`` entry removed afterwards, so a failed test
    leaves nothing for the next one to trip over."""
    yield cluster
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname LIKE 'pgjobs:%'")


def manage(
    cluster: TempCluster,
    db: str,
    *argv: str,
    cron: dict[str, Any] | None = None,
    check: bool = True,
    timeout: float = 120,
    url: str | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": url or cluster.url(db),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.cron_settings",
        "PGJOBS_TEST_CRON": json.dumps(cron or {}),
    }
    env.pop("PGJOBS_WORKER_DB_NAME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "django", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def entries(cluster: TempCluster) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(cluster.dsn()) as conn:
        rows = conn.execute(
            "SELECT jobname, jobid, schedule, command, database, username, "
            "active FROM cron.job WHERE jobname LIKE 'pgjobs:%'"
        ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def query(cluster: TempCluster, db: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(cluster.dsn(db), autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []


def run_details(cluster: TempCluster) -> str:
    rows = query(
        cluster,
        "postgres",
        "SELECT j.jobname, d.status, d.return_message FROM "
        "cron.job_run_details d JOIN cron.job j USING (jobid) ORDER BY runid",
    )
    return "\n".join(map(str, rows)) + "\n" + cluster.server_log()[-3000:]


def test_missing_extension_says_how_to_enable_it(db: None) -> None:
    """The machine's server has no pg_cron preloaded: the command explains the steps."""
    with pytest.raises(CommandError) as info:
        call_command("sync_cron", "--pg-cron")
    text = str(info.value)
    assert "shared_preload_libraries = 'pg_cron'" in text and "CREATE EXTENSION pg_cron" in text
    assert "cron.database_name = " in text


@pytest.mark.pgcron
def test_schedules_synced_with_pg_cron_produce_jobs_that_workers_run(
    cron_cluster: TempCluster,
) -> None:
    cluster = cron_cluster
    manage(cluster, "app", "migrate", "-v0")
    schedules = {
        "minutely": {"task": ADD, "schedule": "* * * * *", "args": [2, 3]},
        "hourly": {"task": ADD, "schedule": "@hourly", "args": [1, 1], "queue": "q"},
    }
    out = manage(cluster, "app", "sync_cron", "--pg-cron", "--maintenance", cron=schedules).stdout
    assert "in database 'postgres', running in 'app'" in out
    for name in ("minutely", "hourly", "_reap", "_prune"):
        assert re.search(rf"created\s+pgjobs:{name}\b", out), out
    installed = entries(cluster)
    assert set(installed) == {"pgjobs:minutely", "pgjobs:hourly", "pgjobs:_reap", "pgjobs:_prune"}
    assert {e[3] for e in installed.values()} == {"app"}
    assert installed["pgjobs:hourly"][1] == "0 * * * *"

    # Re-syncing changes nothing.
    out = manage(cluster, "app", "sync_cron", "--pg-cron", "--maintenance", cron=schedules).stdout
    assert out.count("unchanged") == 4 and "created" not in out and "updated" not in out
    assert entries(cluster) == installed

    # Removing a schedule removes its entry (and only it); a changed one is updated in place.
    del schedules["hourly"]
    schedules["minutely"]["args"] = [20, 30]
    out = manage(cluster, "app", "sync_cron", "--pg-cron", "--maintenance", cron=schedules).stdout
    assert re.search(r"removed\s+pgjobs:hourly", out) and re.search(
        r"updated\s+pgjobs:minutely", out
    )
    after = entries(cluster)
    assert set(after) == {"pgjobs:minutely", "pgjobs:_reap", "pgjobs:_prune"}
    assert after["pgjobs:minutely"][0] == installed["pgjobs:minutely"][0]  # same jobid
    assert "[20, 30]" in after["pgjobs:minutely"][2]

    # Zero workers up: at the next minute pg_cron enqueues, reaps and prunes by itself.
    # A minute boundary may already have passed during the syncs above (or pass between
    # the statements below), so the table starts empty here and the wait accepts any
    # number of ticks: what matters is that one came after the rows were in place.
    query(
        cluster,
        "app",
        """
        DELETE FROM django_pgjobs_job;
        INSERT INTO django_pgjobs_job (task, status, attempts, heartbeat_at, started_at, worker)
        VALUES ('tests.testapp.jobs.noop', 'running', 1, now() - interval '1 hour',
                now() - interval '1 hour', 'lost-worker');
        INSERT INTO django_pgjobs_job (task, status, finished_at)
        VALUES ('tests.testapp.jobs.noop', 'completed', now() - interval '30 days');
    """,
    )

    def minute_done() -> bool:
        rows = query(
            cluster,
            "app",
            "SELECT "
            "(SELECT count(*) FROM django_pgjobs_job WHERE idempotency_key LIKE "
            "'cron:minutely:%'), "
            "(SELECT count(*) FROM django_pgjobs_job WHERE status = 'running'), "
            "(SELECT count(*) FROM django_pgjobs_job WHERE status = 'completed')",
        )
        minutely, running, completed = rows[0]
        return minutely >= 1 and running == 0 and completed == 0

    try:
        wait_until(minute_done, timeout=80, interval=0.5, message="pg_cron's minute tick")
    except AssertionError:
        raise AssertionError(run_details(cluster)) from None
    fired = query(
        cluster,
        "app",
        "SELECT idempotency_key, args::text, status FROM "
        "django_pgjobs_job WHERE idempotency_key LIKE 'cron:%'",
    )
    for key, args, status in fired:
        assert re.fullmatch(r"cron:minutely:\d{4}-\d\d-\d\dT\d\d:\d\d:00Z", key), key
        assert (args, status) == ("[20, 30]", "pending")
    reaped = query(
        cluster,
        "app",
        "SELECT status, last_error FROM django_pgjobs_job WHERE task = 'tests.testapp.jobs.noop'",
    )
    assert reaped[0][0] == "pending" and "reclaimed by pg_cron" in reaped[0][1]

    # pg_cron only inserted rows; a worker does the work.
    manage(cluster, "app", "runjobs", "--burst", "--no-maintenance", cron=schedules)
    done = query(
        cluster,
        "app",
        "SELECT j.status, r.value::text FROM django_pgjobs_job j "
        "LEFT JOIN django_pgjobs_jobresult r ON r.job_id = j.id "
        "WHERE j.idempotency_key LIKE 'cron:minutely:%'",
    )
    assert done and set(done) == {("completed", "50")}, done

    out = manage(cluster, "app", "sync_cron", "--pg-cron", "--uninstall").stdout
    assert out.count("removed") == 3 and entries(cluster) == {}


@pytest.mark.pgcron
def test_same_database_uses_cron_schedule_and_refuses_what_pg_cron_cannot_do(
    cron_cluster: TempCluster,
) -> None:
    cluster = cron_cluster
    manage(cluster, "postgres", "migrate", "-v0")
    ok = {"nightly": {"task": ADD, "schedule": "0 3 * * *", "args": [1, 2]}}
    out = manage(cluster, "postgres", "sync_cron", "--pg-cron", cron=ok).stdout
    assert "in this database" in out and re.search(r"created\s+pgjobs:nightly", out)
    assert entries(cluster)["pgjobs:nightly"][3] == "postgres"
    dry = manage(
        cluster, "postgres", "sync_cron", "--pg-cron", "--dry-run", "--uninstall", cron=ok
    ).stdout
    assert "dry run" in dry and "pgjobs:nightly" in entries(cluster)

    for bad, fragment in [
        ({"s": {"task": ADD, "schedule": "*/5 * * * * *", "args": [1, 2]}}, "seconds field"),
        (
            {
                "z": {
                    "task": ADD,
                    "schedule": "0 3 * * *",
                    "args": [1, 2],
                    "timezone": "Europe/Paris",
                }
            },
            "runs schedules in UTC",
        ),
    ]:
        proc = manage(cluster, "postgres", "sync_cron", "--pg-cron", cron=bad, check=False)
        assert proc.returncode != 0 and fragment in proc.stderr, proc.stderr
        assert set(entries(cluster)) == {"pgjobs:nightly"}  # a refused sync changes nothing
    manage(cluster, "postgres", "sync_cron", "--pg-cron", "--uninstall", cron=ok)
    assert entries(cluster) == {}


def test_a_sync_under_assume_role_schedules_as_the_role_django_works_as(
    cron_cluster: TempCluster,
) -> None:
    """``OPTIONS["assume_role"]`` (here from the URL): Django's connection works as the
    assumed role, so the sync names it as the entries' user, and its own connection to
    the pg_cron database must be that role too (pg_cron lets only a superuser schedule
    for another user: as the login role the sync failed)."""
    cluster = cron_cluster
    cluster.create_database("roleapp")
    manage(cluster, "roleapp", "migrate", "-v0")
    query(cluster, "postgres", "CREATE ROLE cron_owner NOLOGIN")
    query(cluster, "postgres", "CREATE ROLE cron_login LOGIN NOINHERIT IN ROLE cron_owner")
    query(cluster, "postgres", "GRANT USAGE ON SCHEMA cron TO cron_owner")
    query(cluster, "postgres", "GRANT pg_read_all_settings TO cron_owner")  # cron.database_name
    query(cluster, "postgres", "GRANT EXECUTE ON FUNCTION cron.schedule_in_database TO cron_owner")
    query(cluster, "roleapp", "GRANT ALL ON ALL TABLES IN SCHEMA public TO cron_owner")
    query(cluster, "roleapp", "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO cron_owner")
    url = f"postgres://cron_login@127.0.0.1:{cluster.port}/roleapp?assume_role=cron_owner"
    ok = {"nightly": {"task": ADD, "schedule": "0 3 * * *", "args": [1, 2]}}
    out = manage(cluster, "roleapp", "sync_cron", "--pg-cron", cron=ok, url=url).stdout
    assert re.search(r"created\s+pgjobs:nightly", out), out
    assert entries(cluster)["pgjobs:nightly"][3:5] == ("roleapp", "cron_owner")
    manage(cluster, "roleapp", "sync_cron", "--pg-cron", "--uninstall", cron=ok, url=url)
    assert entries(cluster) == {}
