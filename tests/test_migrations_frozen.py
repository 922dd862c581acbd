"""Migrations are frozen and pgjobs_enqueue v2 is pinned."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from django.db import connection

from django_pgjobs.db import workflow_trigger
from django_pgjobs.db.functions import ENQUEUE_FUNCTION
from django_pgjobs.models import Job

MIGRATIONS = Path(importlib.import_module("django_pgjobs.migrations").__file__).parent  # type: ignore[arg-type]


def _migration_files() -> list[Path]:
    return sorted(p for p in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))


@pytest.mark.parametrize("path", _migration_files(), ids=lambda p: p.stem)
def test_migrations_do_not_import_live_code(path: Path) -> None:
    """Editing the package must never rewrite an applied migration."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            assert not (
                name.startswith("django_pgjobs") and not name.startswith("django_pgjobs.migrations")
            ), f"{path.name} imports {name}"


def test_the_newest_enqueue_function_is_what_the_code_expects() -> None:
    versions: dict[int, str] = {}
    for path in _migration_files():
        module = importlib.import_module(f"django_pgjobs.migrations.{path.stem}")
        for name, value in vars(module).items():
            match = re.fullmatch(r"ENQUEUE_FUNCTION_V(\d+)", name)
            if match:
                versions[int(match[1])] = value
    assert versions, "no migration holds the text of pgjobs_enqueue"
    assert versions[max(versions)] == ENQUEUE_FUNCTION


def _newest(pattern: str) -> str:
    versions: dict[int, str] = {}
    for path in _migration_files():
        module = importlib.import_module(f"django_pgjobs.migrations.{path.stem}")
        for name, value in vars(module).items():
            match = re.fullmatch(pattern, name)
            if match:
                versions[int(match[1])] = value
    assert versions, f"no migration holds {pattern}"
    return versions[max(versions)]


def test_the_newest_workflow_functions_are_what_the_code_expects() -> None:
    """The trigger and functions of workflows (migration 0008): frozen in their
    migration, equal to db/workflow_trigger.py's text until a new migration replaces them."""
    assert _newest(r"WORKFLOW_FUNCTIONS_V(\d+)") == workflow_trigger.WORKFLOW_FUNCTIONS
    assert _newest(r"WORKFLOW_FUNCTIONS_DROP_V(\d+)") == workflow_trigger.WORKFLOW_FUNCTIONS_DROP


@pytest.mark.django_db
def test_the_workflow_trigger_is_installed_on_the_jobs_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname, tgenabled FROM pg_trigger"
            " WHERE tgrelid = 'django_pgjobs_job'::regclass AND NOT tgisinternal"
        )
        rows = cursor.fetchall()
    assert rows == [("pgjobs_workflow_step", "O")]


@pytest.mark.django_db
def test_the_installed_function_pins_its_search_path() -> None:
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT n.nspname, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE p.proname = 'pgjobs_enqueue'""")
        rows = cursor.fetchall()
        cursor.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.oid = 'django_pgjobs_job'::regclass"
        )
        (table_schema,) = cursor.fetchone()
    assert rows == [(table_schema, ["search_path=pg_catalog, pg_temp"])]


@pytest.mark.django_db
def test_another_search_path_still_writes_the_jobs_table() -> None:
    """A caller (pg_cron, a trigger) whose search_path finds another django_pgjobs_job
    first still enqueues into the real one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT quote_ident(current_schema())")
        (schema,) = cursor.fetchone()
        cursor.execute("CREATE SCHEMA decoy")
        cursor.execute(
            "CREATE TABLE decoy.django_pgjobs_job (LIKE django_pgjobs_job INCLUDING ALL)"
        )
        cursor.execute(f"SET LOCAL search_path = decoy, {schema}")
        cursor.execute(f"SELECT {schema}.pgjobs_enqueue('tests.testapp.jobs.noop')")
        (new_id,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM decoy.django_pgjobs_job")
        (in_decoy,) = cursor.fetchone()
        cursor.execute(f"SET LOCAL search_path = {schema}")
    assert in_decoy == 0
    assert Job.objects.filter(pk=new_id, task="tests.testapp.jobs.noop").exists()
