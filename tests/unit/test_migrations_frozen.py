"""The migrations as files: one squashed migration replaces the series 0001-0015, later
ones depend on it by name, and each SQL function is written once, in db/ (the
installed functions: tests/db/test_migrations_frozen.py)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from django.db import migrations

from django_pgjobs.db import functions, workflow_trigger

PACKAGE = Path(importlib.import_module("django_pgjobs").__file__).parent  # type: ignore[arg-type]
MIGRATIONS = PACKAGE / "migrations"
SQUASH = "0001_squashed_0015_job_timeout_no_limit"

#: What the migrations may import of the package: the SQL texts of the functions.
SQL_TEXTS = {"django_pgjobs.db.functions", "django_pgjobs.db.workflow_trigger"}


def _migration_files() -> list[Path]:
    return sorted(p for p in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))


@pytest.mark.parametrize("path", _migration_files(), ids=lambda p: p.stem)
def test_migrations_import_only_the_sql_texts_of_the_package(path: Path) -> None:
    """A migration that imported a model or a setting would change with the code it runs
    against; the functions' texts are meant to (a fresh database gets the code's)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            assert not name.startswith("django_pgjobs") or name in SQL_TEXTS, (
                f"{path.name} imports {name}"
            )


def test_one_squashed_migration_replaces_the_series_0001_to_0015() -> None:
    """Kept so that a database migrated by the series migrates on (Django marks the
    squash applied there and runs nothing)."""
    squash = importlib.import_module(f"django_pgjobs.migrations.{SQUASH}").Migration
    assert [name for _, name in squash.replaces] == [
        "0001_initial",
        "0002_pgjobs_enqueue",
        "0003_enqueue_function_v2",
        "0004_job_timeout",
        "0005_flow_control",
        "0006_trace_context",
        "0007_status_index_without_running",
        "0008_workflows",
        "0009_held_slots",
        "0010_suspects",
        "0011_minute_rollup",
        "0012_workflow_trigger_v2",
        "0013_workflow_trigger_v3",
        "0014_workflow_trigger_v4",
        "0015_job_timeout_no_limit",
    ]
    assert _migration_files()[0].stem == SQUASH
    ran = [
        (op.sql, op.reverse_sql) for op in squash.operations if isinstance(op, migrations.RunSQL)
    ]
    assert ([functions.ENQUEUE_FUNCTION], [_drop_enqueue()]) in ran
    assert (
        [workflow_trigger.WORKFLOW_FUNCTIONS],
        [workflow_trigger.WORKFLOW_FUNCTIONS_DROP],
    ) in ran


def test_later_migrations_depend_on_the_squash_by_its_name() -> None:
    """Not on a replaced migration: its file is gone, so on a database part-way through
    the series Django could not place the later one and would fail with
    NodeNotFoundError before check E011 names the fix."""
    replaced = set(importlib.import_module(f"django_pgjobs.migrations.{SQUASH}").Migration.replaces)
    for path in _migration_files()[1:]:
        later = importlib.import_module(f"django_pgjobs.migrations.{path.stem}").Migration
        assert not set(later.dependencies) & replaced, (path.name, later.dependencies)


def _drop_enqueue() -> str:
    return str(importlib.import_module(f"django_pgjobs.migrations.{SQUASH}").ENQUEUE_FUNCTION_DROP)


@pytest.mark.parametrize(
    "function",
    ["pgjobs_enqueue", "pgjobs_batch_fire", "pgjobs_workflow_step", "pgjobs_workflow_trigger"],
)
def test_each_sql_function_is_written_once(function: str) -> None:
    """One text per function in the package, none in a migration: a change to a function
    is made in one place."""
    creating = f"CREATE OR REPLACE FUNCTION @SCHEMA@.{function}("
    holders = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if creating in path.read_text()
    ]
    assert len(holders) == 1 and not holders[0].startswith("migrations"), holders
