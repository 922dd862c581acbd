"""The traps of a new user's first hour, each shown with a real command:
what ``runjobs`` says by itself, queue-name typos, a database that is not migrated or
does not exist, a forgotten INSTALLED_APPS entry, several bad settings at once, and
the worker-local health file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_pgjobs.checks import check_settings
from django_pgjobs.health.health_file import main as health_main
from django_pgjobs.models import Job
from django_pgjobs.worker.loop import DEFAULT_CONCURRENCY
from tests.conftest import ROOT, WorkerProcess, dsn, manage, wait_until

pytestmark = pytest.mark.process


# --------------------------------------------------------------------------- logging


def test_runjobs_logs_by_itself_and_ends_with_one_summary_line(transactional_db: Any) -> None:
    Job.objects.enqueue("tests.testapp.jobs.add", args=[1, 2])
    proc = manage("runjobs", "--burst", settings="tests.settings_nologging")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert any(
        f" starting: queues=* concurrency={DEFAULT_CONCURRENCY}" in line for line in lines
    ), lines
    summaries = [line for line in lines if " stopped: " in line or " done: " in line]
    assert len(summaries) == 1, lines
    assert "'completed': 1" in summaries[0]


def test_runjobs_quiet_at_verbosity_0_and_debug_at_2(transactional_db: Any) -> None:
    quiet = manage("runjobs", "--burst", "-v", "0", settings="tests.settings_nologging")
    assert quiet.returncode == 0
    assert (quiet.stdout, quiet.stderr) == ("", "")
    Job.objects.enqueue("tests.testapp.jobs.add", args=[1, 2])
    loud = manage("runjobs", "--burst", "-v", "2", settings="tests.settings_nologging")
    assert " starting: " in loud.stderr and " stopped: " in loud.stderr


def test_summary_on_stdout_when_logging_hides_info(transactional_db: Any, tmp_path: Path) -> None:
    (tmp_path / "warn_only.py").write_text(
        "from tests.settings import *  # noqa\n"
        "LOGGING = {'version': 1, 'disable_existing_loggers': False,\n"
        "    'handlers': {'console': {'class': 'logging.StreamHandler'}},\n"
        "    'loggers': {'django_pgjobs': {'handlers': ['console'], 'level': 'WARNING'}}}\n"
    )
    env_path = f"{tmp_path}{os.pathsep}{ROOT}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "warn_only",
        "PYTHONPATH": env_path,
        "PGJOBS_WORKER_DB_NAME": connection.settings_dict["NAME"],
    }
    proc = subprocess.run(
        [sys.executable, "-m", "django", "runjobs", "--burst"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(" stopped: ") == 1 and "starting" not in proc.stderr


# --------------------------------------------------------------------------- queue names


def test_a_queue_name_typo_gets_a_warning_with_a_suggestion(transactional_db: Any) -> None:
    proc = manage("runjobs", "--burst", "--queues", "emials", settings="tests.settings_nologging")
    assert proc.returncode == 0
    assert (
        "queue 'emials': no @job, PGJOBS['QUEUES'] or CRON entry uses it and no pending "
        "job is on it, so this worker may wait for ever. Did you mean 'emails'?" in proc.stderr
    ), proc.stderr


def test_a_burst_on_an_unused_queue_explains_why_it_did_nothing(transactional_db: Any) -> None:
    Job.objects.enqueue("tests.testapp.jobs.add", args=[1, 2])
    proc = manage("runjobs", "--burst", "--queues", "nosuch", settings="tests.settings_nologging")
    assert proc.returncode == 0
    assert (
        "did nothing: nothing was pending on nosuch; pending jobs wait on other queues: "
        "default (1). Pass --queues with those names" in proc.stderr
    ), proc.stderr
    assert Job.objects.get().status == "pending"


def test_known_queues_get_no_warning(transactional_db: Any) -> None:
    proc = manage(
        "runjobs", "--burst", "--queues", "emails,default", settings="tests.settings_nologging"
    )
    assert "Did you mean" not in proc.stderr and "no @job" not in proc.stderr


# --------------------------------------------------------------------------- not migrated


def test_runjobs_before_migrate_exits_at_once_naming_the_fix(scratch_db: Callable[[], str]) -> None:
    empty = scratch_db()
    for args in (["--burst"], []):  # a long-running worker cannot do anything either
        started = time.monotonic()
        proc = manage("runjobs", *args, db=empty, timeout=30)
        assert proc.returncode == 2, proc.stderr
        assert time.monotonic() - started < 20
        assert (
            f"runjobs: the django-pgjobs tables do not exist in database '{empty}' "
            "(alias 'default'): run `python manage.py migrate`"
        ) in proc.stderr


def test_runjobs_against_a_missing_database_names_the_fix(transactional_db: Any) -> None:
    name = f"{connection.settings_dict['NAME']}_does_not_exist"
    proc = manage("runjobs", "--burst", db=name, timeout=30)
    assert proc.returncode == 2
    assert (
        f"database '{name}' (alias 'default') does not exist: create it (`createdb {name}`"
        in proc.stderr
    ), proc.stderr
    assert "run `python manage.py migrate`" in proc.stderr


def test_runjobs_with_an_unapplied_migration_says_which(scratch_db: Callable[[], str]) -> None:
    db = scratch_db()
    migrated = manage("migrate", "django_pgjobs", db=db, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    with psycopg.connect(dsn(), dbname=db, autocommit=True) as conn:
        conn.execute("DELETE FROM django_migrations WHERE app = 'django_pgjobs'")
    proc = manage("runjobs", "--burst", db=db)
    assert proc.returncode == 2
    assert (
        "lacks django-pgjobs migration(s) django_pgjobs.0001_squashed_0015_job_timeout_no_limit"
        in proc.stderr
    )
    assert "run `python manage.py migrate`" in proc.stderr


def test_jobs_status_retry_jobs_and_enqueue_before_migrate(scratch_db: Callable[[], str]) -> None:
    empty = scratch_db()
    fix = f"the django-pgjobs tables do not exist in database '{empty}'"
    status = manage("jobs_status", db=empty)
    assert status.returncode == 1 and f"CommandError: {fix}" in status.stderr, status.stderr
    assert "Traceback" not in status.stderr
    check = manage("jobs_status", "--check", db=empty)
    assert check.returncode == 2 and fix in check.stderr
    retry = manage("retry_jobs", db=empty)
    assert retry.returncode == 1 and fix in retry.stderr
    enqueue = manage(
        "shell", "-c", "from tests.testapp.jobs import add; add.enqueue(1, 2)", db=empty
    )
    assert enqueue.returncode == 1
    assert (
        f"ProgrammingError: cannot enqueue tests.testapp.jobs.add: {fix} (alias "
        "'default'): run `python manage.py migrate`"
    ) in enqueue.stderr


# --------------------------------------------------------------------------- app not installed


def test_a_forgotten_installed_app_is_named_at_import_and_enqueue(transactional_db: Any) -> None:
    fix = "add 'django_pgjobs' to INSTALLED_APPS in your settings"
    decorated = manage("shell", "-c", "import tests.testapp.jobs", settings="tests.settings_noapp")
    assert decorated.returncode == 1
    assert (
        "ImproperlyConfigured: @job tests.testapp.jobs.add: django-pgjobs is not installed "
        f"in this project: {fix}"
    ) in decorated.stderr, decorated.stderr
    models = manage(
        "shell", "-c", "from django_pgjobs.models import Job", settings="tests.settings_noapp"
    )
    assert models.returncode == 1 and fix in models.stderr
    assert "isn't in an application in INSTALLED_APPS" not in models.stderr


# --------------------------------------------------------------------------- settings


def test_every_bad_pgjobs_key_is_reported_at_once(settings: Any) -> None:
    settings.PGJOBS = {"stale_after": 30, "POLL_INTERVALL": 1, "MAX_ATTEMPTS": 0, "LISTEN": "no"}
    messages = check_settings()
    assert [m.id for m in messages] == ["django_pgjobs.E002"] * 4
    text = [m.msg for m in messages]
    assert text[0] == (
        "PGJOBS has an unknown key 'stale_after': keys are upper case. Did you mean 'STALE_AFTER'?"
    )
    assert "Did you mean 'POLL_INTERVAL'" in text[1]
    assert "MAX_ATTEMPTS" in text[2] and "LISTEN" in text[3]
    assert all("docs/" not in (m.hint or "") for m in messages)
    assert "'Settings' page" in (messages[0].hint or "")


def test_manage_check_lists_every_bad_key(tmp_path: Path) -> None:
    (tmp_path / "bad_keys.py").write_text(
        "from tests.settings import *  # noqa\n"
        "PGJOBS = {'max_attempts': 3, 'STALE_AFTR': 30, 'LISTEN': 'yes'}\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bad_keys",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("django_pgjobs.E002") == 3, proc.stderr
    assert "Did you mean 'MAX_ATTEMPTS'?" in proc.stderr
    assert "Did you mean 'STALE_AFTER'?" in proc.stderr


# --------------------------------------------------------------------------- health file


def test_health_file_follows_the_worker(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "alive"
    assert health_main([str(path)]) == 1
    assert "does not exist" in capsys.readouterr().err
    worker = start_worker("--health-file", str(path))
    wait_until(path.exists, timeout=30, message="the health file")
    assert health_main([str(path), "--max-age", "10"]) == 0
    first = path.stat().st_mtime
    wait_until(
        lambda: path.exists() and path.stat().st_mtime > first,
        timeout=30,
        message="the health file to be touched again",
    )
    os.utime(path, (time.time() - 120, time.time() - 120))
    assert health_main([str(path)]) == 1
    assert "is 120s old (limit 60s)" in capsys.readouterr().err
    worker.signal(15)
    assert worker.wait(30) == 0
    assert not path.exists()


def test_runjobs_with_autocommit_off_exits_at_once_naming_the_setting(
    transactional_db: Any,
) -> None:
    """With ``AUTOCOMMIT = False`` a worker's claims never committed: every job it ran
    was "fenced" on completion and left pending. It refuses to start instead."""
    job = Job.objects.enqueue("tests.testapp.jobs.add", args=[1, 2])
    proc = manage("runjobs", "--burst", settings="tests.settings_no_autocommit", timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "runjobs: DATABASES['default']['AUTOCOMMIT'] is False" in proc.stderr
    assert "leave AUTOCOMMIT at its default (True)" in proc.stderr
    assert Job.objects.get(id=job.id).status == "pending"  # nothing was claimed


@pytest.mark.parametrize(
    "argv",
    [
        ("cancel_jobs", "--ids", "{id}"),
        ("retry_jobs", "--ids", "{id}"),
        ("pause_queue", "default"),
        ("resume_queue", "default"),
        ("reap_jobs",),
        ("prune_jobs",),
        ("sync_cron",),
    ],
    ids=lambda argv: argv[0],
)
def test_commands_that_write_refuse_autocommit_off(
    transactional_db: Any, argv: tuple[str, ...]
) -> None:
    """With autocommit off ``cancel_jobs`` printed "Cancelled 1 job." and the job stayed
    pending: its write waited in a transaction nothing committed. Each command that
    writes now refuses, naming the setting, and changes nothing."""
    job = Job.objects.enqueue("tests.testapp.jobs.add", args=[1, 2])
    args = [a.format(id=job.id) for a in argv]
    proc = manage(*args, settings="tests.settings_no_autocommit", timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert (
        f"DATABASES['default']['AUTOCOMMIT'] is False, and {argv[0]} needs Django's autocommit"
        in proc.stderr
    ), proc.stderr
    assert Job.objects.get(id=job.id).status == "pending"
