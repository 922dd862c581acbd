"""Every write goes through the storage façade (``django_pgjobs/db/store.py``): the
import-linter contract of pyproject.toml that says so covers every module of ``db/``
holding a write statement and every part of the package above ``db/``, the code
imports no such module from above, and each entry of the façade says what it writes.

The contract alone would go quietly stale: a new module of writes, or a new package
above the storage, that nobody added to its lists would be left out of it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import tomllib
from pathlib import Path
from typing import Any

import grimp

from django_pgjobs import db
from django_pgjobs.db import store

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_pgjobs"

#: What the façade sits on: the storage itself, and the ground below it.
BELOW = {"db", "conf", "states", "exceptions", "signals", "support", "version", "migrations"}

# A statement that writes a row of the package's tables (the schema's DDL, which the
# migrations run, is not a write to rows: CREATE, DROP, or a DO block of them).
WRITE = re.compile(
    r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|COPY)\s+(?:\S+\.)?\"?django_pgjobs_\w+", re.I
)


def contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    forbidden = [c for c in contracts if c["type"] == "forbidden" and "store" in c["name"]]
    assert len(forbidden) == 1, "pyproject.toml lost the contract of the storage façade"
    return forbidden[0]


def write_modules() -> set[str]:
    """The modules of ``db/`` with a statement that writes rows (not the façade)."""
    found = set()
    for info in pkgutil.iter_modules(db.__path__, db.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                name.isupper()
                and not name.startswith("_")  # a fragment of a statement named on its own
                and isinstance(value, str)
                and not re.match(r"\s*(CREATE|DROP|DO)\b", value)
                and WRITE.search(value)
                and getattr(module, "__name__", "") != store.__name__
            ):
                found.add(info.name)
    return found


def above_storage() -> set[str]:
    """Every top-level module and package of django_pgjobs above the storage layer."""
    names = {
        path.stem if path.is_file() else path.name
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    return {f"django_pgjobs.{name}" for name in names - BELOW}


def test_the_contract_forbids_every_module_of_writes_to_everything_above_the_storage() -> None:
    terms = contract()
    writes = write_modules()
    # The statement modules this reads as writes (a sanity check of the scan itself).
    assert {"django_pgjobs.db.job_outcome", "django_pgjobs.db.workflows"} <= writes
    assert "django_pgjobs.db.reports" not in writes
    missing = sorted(writes - set(terms["forbidden_modules"]))
    assert not missing, f"modules of write statements the contract leaves open: {missing}"
    uncovered = sorted(above_storage() - set(terms["source_modules"]))
    assert not uncovered, f"parts of the package above db/ the contract leaves out: {uncovered}"
    assert terms.get("allow_indirect_imports") is True  # through the façade is allowed


def test_nothing_above_the_storage_imports_a_module_of_writes() -> None:
    graph = grimp.build_graph("django_pgjobs", exclude_type_checking_imports=True)
    writes = write_modules()
    wrong = sorted(
        f"{importer} imports {imported}"
        for imported in writes
        for importer in graph.find_modules_that_directly_import(imported)
        if not importer.startswith("django_pgjobs.db.")
    )
    assert not wrong, f"writes that bypass django_pgjobs/db/store.py: {wrong}"


#: The header after the façade's entries: what follows are texts and reads it re-exports.
ENTRIES_END = "statements run by another process"

# A statement's name as the façade's docstrings quote it (``JOB_COMPLETE_MANY[_REDO]``),
# and as a bare name, the way a re-export's comment and run function name it.
QUOTED = re.compile(r"``[A-Z][A-Z_]+(?:\[_[A-Z]+\])?``")
BARE = re.compile(r"\b[A-Z]+(?:_[A-Z]+)+\b")


def facade_entries() -> tuple[dict[str, Any], dict[str, tuple[Any, str]]]:
    """The façade's entries, read from its source: the functions it defines, and the run
    functions it re-exports (``name = module.name``), each with the comment above it."""
    source = inspect.getsource(store)
    lines = source.splitlines()
    end = next(n for n, line in enumerate(lines, 1) if ENTRIES_END in line)
    own: dict[str, Any] = {}
    reexported: dict[str, tuple[Any, str]] = {}
    for node in ast.parse(source).body:
        if node.lineno > end:
            break
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            own[node.name] = getattr(store, node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if inspect.isfunction(getattr(store, name)):
                above = lines[node.lineno - 2].strip()
                reexported[name] = (getattr(store, name), above)
    return own, reexported


def test_each_entry_of_the_facade_names_its_statement() -> None:
    own, reexported = facade_entries()
    assert len(own) + len(reexported) > 40, "the façade lost its entries"
    unnamed = [name for name, f in own.items() if not QUOTED.search(inspect.getdoc(f) or "")]
    assert not unnamed, f"entries of db/store.py whose docstring names no statement: {unnamed}"
    # A re-export says what it writes twice: in one line above it, and in the docstring
    # of the run function it is, which names a statement of that function's own module.
    uncommented = [
        name
        for name, (_, comment) in reexported.items()
        if not (comment.startswith("# ") and BARE.search(comment))
    ]
    assert not uncommented, (
        f"re-exports of db/store.py with no comment naming a statement: {uncommented}"
    )
    unsaid = []
    for name, (function, comment) in reexported.items():
        module = importlib.import_module(function.__module__)
        named = {
            statement
            for statement in BARE.findall(inspect.getdoc(function) or "")
            if isinstance(getattr(module, statement, None), str)
        }
        if not named & set(BARE.findall(comment)):
            unsaid.append(f"{name} ({function.__module__}.{function.__name__})")
    assert not unsaid, (
        f"re-exports whose run function's docstring names not their statement: {unsaid}"
    )
