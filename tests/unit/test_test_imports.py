"""No module of tests/ imports a test module: what tests share lives in tests/helpers/
(fixtures in a tier's conftest.py). Importing a test module couples two modules and
brings the other's fixtures and module-level setup along."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

#: A test module's dotted name: a ``test_*`` module anywhere under ``tests``.
TEST_MODULE = re.compile(r"tests(\.\w+)*\.test_\w+")


def imported_modules(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Each module an import statement names, with its line, function bodies included
    (an import inside a test function couples the modules just the same)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            for alias in node.names:  # from tests.db import test_claim
                yield node.lineno, f"{node.module}.{alias.name}"


def imports_of_test_modules(root: Path) -> list[str]:
    """``importer:line imports module`` for each import of a test module under ``root``."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in imported_modules(tree):
            if TEST_MODULE.fullmatch(module):
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return found


def test_no_module_imports_a_test_module() -> None:
    found = imports_of_test_modules(ROOT)
    assert not found, (
        "move what these share to tests/helpers/ (a fixture: the tier's conftest.py):\n  "
        + "\n  ".join(found)
    )


def test_the_check_names_the_importer_and_the_imported_module(tmp_path: Path) -> None:
    """The check finds each form of import, in a function body too."""
    (tmp_path / "tests" / "db").mkdir(parents=True)
    (tmp_path / "tests" / "db" / "test_a.py").write_text(
        "from tests.db.test_b import helper\n"
        "from tests.db import test_c\n"
        "import tests.process.test_d\n"
        "from tests.helpers.rows import make_job\n"
        "def test_x():\n"
        "    from tests.unit.test_e import f\n"
    )
    assert imports_of_test_modules(tmp_path) == [
        "tests/db/test_a.py:1 imports tests.db.test_b",
        "tests/db/test_a.py:2 imports tests.db.test_c",
        "tests/db/test_a.py:3 imports tests.process.test_d",
        "tests/db/test_a.py:6 imports tests.unit.test_e",
    ]
