"""Small modules with one job each: no module of the package over ``MAX_LINES`` lines
(migrations aside: Django writes them, and a squashed one holds the schema's history).
A module that grows past it is a module doing two jobs; split it by duty."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "django_pgjobs"
MAX_LINES = 500


def test_no_module_of_the_package_is_over_the_limit() -> None:
    over = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.parts
        and (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert over == {}, f"modules over {MAX_LINES} lines (split each by duty): {over}"
