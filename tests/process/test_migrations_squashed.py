"""The squashed migration, with real ``migrate`` commands on databases of their own: an
empty database and one migrated by the series it replaces (0001-0015, the fixture
tests/fixtures/migrations_0001_0015.sql) end with the same schema and the same
django_migrations rows; a database part-way through that series is refused with a
sentence naming the fix (Django itself would migrate nothing and say nothing)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import dsn, manage

pytestmark = pytest.mark.process

SQUASH = "0001_squashed_0015_job_timeout_no_limit"
REPLACED = [
    name
    for _, name in importlib.import_module(f"django_pgjobs.migrations.{SQUASH}").Migration.replaces
]
FIXTURE = Path(__file__).parents[1] / "fixtures" / "migrations_0001_0015.sql"
MIGRATIONS = Path(importlib.import_module("django_pgjobs.migrations").__file__).parent  # type: ignore[arg-type]
#: django_migrations' rows once migrated: the replaced series, the squash and any later.
LATEST = sorted([*REPLACED, *(p.stem for p in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))])

# What a database holds of django-pgjobs, read from the catalogs (names sorted, so two
# databases compare row by row). Columns keep their position: the hot path's statements
# read rows by name, but a dump or a COPY of one database into the other would not.
SCHEMA = {
    "columns": """
        SELECT table_name, ordinal_position, column_name, data_type,
               character_maximum_length, is_nullable, column_default, is_identity
          FROM information_schema.columns
         WHERE table_schema = 'public' AND table_name LIKE 'django\\_pgjobs\\_%'
         ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
         WHERE schemaname = 'public' AND tablename LIKE 'django\\_pgjobs\\_%' ORDER BY 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid), convalidated
          FROM pg_constraint
         WHERE conrelid::regclass::text LIKE 'django\\_pgjobs\\_%' ORDER BY 2""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public' AND p.proname LIKE 'pgjobs\\_%' ORDER BY 1, 2""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid), tgenabled FROM pg_trigger
         WHERE tgrelid::regclass::text LIKE 'django\\_pgjobs\\_%' AND NOT tgisinternal
         ORDER BY 2""",
    "table options": """
        SELECT relname, reloptions FROM pg_class
         WHERE relname LIKE 'django\\_pgjobs\\_%' AND relkind = 'r' ORDER BY 1""",
}


def connect(db: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn(), dbname=db, autocommit=True)


def schema(db: str) -> dict[str, list[tuple[Any, ...]]]:
    with connect(db) as conn:
        return {what: conn.execute(query).fetchall() for what, query in SCHEMA.items()}


def recorded(db: str) -> list[str]:
    """The django_pgjobs rows of django_migrations."""
    with connect(db) as conn:
        rows = conn.execute(
            "SELECT name FROM django_migrations WHERE app = 'django_pgjobs' ORDER BY name"
        ).fetchall()
    return [name for (name,) in rows]


def migrated_fresh(scratch_db: Callable[[], str]) -> str:
    db = scratch_db()
    proc = manage("migrate", "django_pgjobs", db=db, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Applying django_pgjobs.{SQUASH}... OK" in proc.stdout
    return db


def at_0015(scratch_db: Callable[[], str]) -> str:
    """A database as the replaced series left it (the SQL it ran, from the fixture)."""
    db = scratch_db()
    with connect(db) as conn:
        conn.execute(FIXTURE.read_text())  # no parameters: one simple-protocol script
    assert recorded(db) == sorted(REPLACED)
    return db


def test_an_empty_database_migrates_to_the_latest(scratch_db: Callable[[], str]) -> None:
    db = migrated_fresh(scratch_db)
    # Django records the replaced migrations with the squash: code that depends on any of
    # them (another app's migration, a later one of ours) finds it applied.
    assert recorded(db) == LATEST
    shown = manage("showmigrations", "django_pgjobs", db=db, timeout=180)
    assert shown.stdout.split()[:3] == ["django_pgjobs", "[X]", SQUASH], shown.stdout
    tables = schema(db)
    assert [name for _, name, *_ in tables["triggers"]] == ["pgjobs_workflow_step"]
    assert {name for name, *_ in tables["functions"]} == {
        "pgjobs_batch_fire",
        "pgjobs_enqueue",
        "pgjobs_workflow_step",
        "pgjobs_workflow_trigger",
    }


def test_a_database_migrated_by_the_replaced_series_migrates_on_to_the_same_schema(
    scratch_db: Callable[[], str],
) -> None:
    old = at_0015(scratch_db)
    proc = manage("migrate", "django_pgjobs", db=old, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Applying django_pgjobs.{SQUASH}" not in proc.stdout  # nothing of it runs again
    fresh = migrated_fresh(scratch_db)
    assert recorded(old) == recorded(fresh) == LATEST
    before, after = schema(old), schema(fresh)
    for what in SCHEMA:
        assert before[what] == after[what], what
    assert all(before.values())
    # and it migrates back to nothing through the squash's reverse
    proc = manage("migrate", "django_pgjobs", "zero", db=old, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    emptied = schema(old)
    assert emptied["columns"] == emptied["functions"] == emptied["triggers"] == []
    assert recorded(old) == []


def test_a_database_part_way_through_the_replaced_series_is_refused_naming_the_fix(
    scratch_db: Callable[[], str],
) -> None:
    db = at_0015(scratch_db)
    with connect(db) as conn:  # as if migrated by code that stopped at 0006
        conn.execute("DELETE FROM django_migrations WHERE name > '0007'")
    fix = (
        "has django-pgjobs migrations up to 0006_trace_context applied but not the rest of "
        "the series 0001-0015"
    )
    proc = manage("migrate", "django_pgjobs", db=db, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "django_pgjobs.E011" in proc.stderr and fix in proc.stderr, proc.stderr
    assert "migrate it to 0015_job_timeout_no_limit" in proc.stderr
    worker = manage("runjobs", "--burst", db=db, timeout=180)
    assert worker.returncode == 2, worker.stderr
    assert fix in worker.stderr
