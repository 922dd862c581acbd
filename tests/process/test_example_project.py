"""The example shop, run for real: ``manage.py demo`` and the shop's own tests, as subprocesses.

They get a fresh database of their own (``<base name>_demo``) on the test server,
created here and dropped afterwards, so they never touch the test database.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection
from psycopg import sql

pytestmark = pytest.mark.process

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"


def server_params() -> dict[str, str]:
    params = connection.get_connection_params()
    keys = ("host", "port", "user", "password")
    return {k: str(params[k]) for k in keys if params.get(k) not in (None, "")}


def url_for(name: str) -> str:
    """A DATABASE_URL for database ``name`` on the test server (TCP or Unix socket)."""
    p = server_params()
    auth = quote(p.get("user", ""), safe="") + (
        ":" + quote(p["password"], safe="") if p.get("password") else ""
    )
    host = p.get("host", "")
    if not host or host.startswith("/"):
        return f"postgres://{auth}@/{name}" + (f"?host={quote(host)}" if host else "")
    return f"postgres://{auth}@{host}:{p.get('port', '5432')}/{name}"


def drop(admin: psycopg.Connection, name: str) -> None:
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def demo_url() -> Iterator[str]:
    name = f"{connection.settings_dict['NAME']}_demo"[:63]
    with psycopg.connect(**server_params(), dbname="postgres", autocommit=True) as admin:
        drop(admin, name)  # a leftover from an interrupted run
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield url_for(name)
        finally:
            drop(admin, name)
            drop(admin, f"test_{name}"[:63])  # `manage.py test` normally drops it itself


def manage(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "example_project.settings"}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def counts(output: str) -> dict[str, int]:
    found = dict(re.findall(r"^\s+(jobs|completed|retried|dead)\s+(\d+)", output, re.MULTILINE))
    return {key: int(value) for key, value in found.items()}


def test_demo_reports_its_batch_and_can_run_again(demo_url: str) -> None:
    first = manage(demo_url, "demo")
    assert first.returncode == 0, first.stdout + first.stderr
    # 20 orders x 2 jobs + 1 CRM export. Cards: 2 declined (dead at once), 4 time out
    # once (retried, then complete); the CRM export fails 3 times (retried, then dead).
    assert counts(first.stdout) == {"jobs": 41, "completed": 38, "retried": 5, "dead": 3}
    assert "41/41 finished" in first.stdout
    assert "rolled back with its 2 jobs" in first.stdout
    assert "orders paid 18, invoice emails sent 20" in first.stdout
    assert first.stdout.count("     dead #") == 3

    # Same database, already migrated: a fresh, smaller batch, reported on its own.
    second = manage(demo_url, "demo", "--orders", "10")
    assert second.returncode == 0, second.stdout + second.stderr
    assert counts(second.stdout) == {"jobs": 21, "completed": 19, "retried": 3, "dead": 2}
    assert "orders paid 9, invoice emails sent 10" in second.stdout


def test_demo_rejects_bad_arguments_before_touching_the_database(demo_url: str) -> None:
    result = manage(demo_url, "demo", "--orders", "0")
    assert result.returncode != 0
    assert "--orders must be between 1 and 10000, got 0" in result.stderr


def test_shop_own_tests_pass(demo_url: str) -> None:
    """The order view enqueues inside the order's transaction (see example_project/shop/tests.py)."""
    # Creates and migrates a test database of its own: minutes on a loaded box.
    result = manage(demo_url, "test", "shop", "--noinput", "-v", "2", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"Ran 6 tests in .*\n\nOK", result.stderr), result.stderr
    assert re.search(
        r"test_a_rolled_back_order_leaves_no_job_behind \(.*\) \.\.\. ok", result.stderr
    ), result.stderr
