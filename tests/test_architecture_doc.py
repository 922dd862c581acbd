"""The architecture page's map stays true: every file it names exists, every module of
the package is on the map, and every ``Class.method`` / function it attributes to a
file is defined there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "explanation" / "architecture.md"
PACKAGE = ROOT / "django_pgjobs"

FILE_REF = re.compile(r"`((?:django_pgjobs|tests|docs)/[\w/.-]+\.(?:py|md))`")
# `Name` or `Class.method` written right before "in `path.py`" (the path of one job).
SYMBOL_IN_FILE = re.compile(r"`([\w.]+)`\s+in\s+`(django_pgjobs/[\w/]+\.py)`")
# | `path.py` (`symbol`) ...  in the one-minute table.
FILE_THEN_SYMBOL = re.compile(r"`(django_pgjobs/[\w/]+\.py)`\s+\(`([\w.]+)`\)")


def page() -> str:
    return PAGE.read_text()


def defined_names(path: Path) -> set[str]:
    """Top-level functions/classes and ``Class.method`` names defined in ``path``."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
    return names


def test_every_file_the_page_names_exists() -> None:
    refs = FILE_REF.findall(page())
    assert len(refs) > 30, "the map lost its file references"
    missing = sorted({ref for ref in refs if not (ROOT / ref).exists()})
    assert not missing, f"docs/explanation/architecture.md names files that do not exist: {missing}"


def test_every_module_of_the_package_is_on_the_map() -> None:
    named = set(FILE_REF.findall(page()))
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("migrations", "management") or path.name == "__main__.py":
            continue  # the migrations and commands are described as groups
        if path.name == "__init__.py" and rel.parent.name not in ("", "testing"):
            continue  # a subpackage's __init__ only describes its modules
        modules.add(str(path.relative_to(ROOT)))
    unmapped = sorted(modules - named)
    assert not unmapped, f"modules missing from docs/explanation/architecture.md: {unmapped}"


def test_symbols_are_defined_where_the_page_says() -> None:
    text = page()
    pairs = [(sym, path) for sym, path in SYMBOL_IN_FILE.findall(text)]
    pairs += [(sym, path) for path, sym in FILE_THEN_SYMBOL.findall(text)]
    assert pairs, "the page attributes no symbol to a file any more"
    wrong = [
        f"{sym} in {path}"
        for sym, path in pairs
        if sym.split(".")[-1] not in {n.split(".")[-1] for n in defined_names(ROOT / path)}
        or ("." in sym and sym not in defined_names(ROOT / path))
    ]
    assert not wrong, (
        f"docs/explanation/architecture.md attributes symbols to the wrong file: {wrong}"
    )
