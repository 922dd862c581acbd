"""The settings reference is made from the declarations: the page's tables are exactly
``conf.reference_tables()``, and every declaration is complete."""

from __future__ import annotations

import os
import re
from pathlib import Path

from django_pgjobs.conf import DEFAULTS, ENVIRONMENT, SETTINGS, reference_tables

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"
BLOCK = re.compile(
    r"(<!-- BEGIN settings tables[^\n]*-->\n\n)(.*?)(\n<!-- END settings tables -->)", re.S
)
REGENERATE = "PGJOBS_WRITE_DOCS=1 scripts/dev test tests/unit/test_settings_page.py"


def test_the_page_shows_exactly_the_declared_tables() -> None:
    text = PAGE.read_text()
    match = BLOCK.search(text)
    assert match, "docs/reference/settings.md lost its BEGIN/END settings tables markers"
    if os.environ.get("PGJOBS_WRITE_DOCS") == "1":
        text = text[: match.start(2)] + reference_tables() + text[match.end(2) :]
        PAGE.write_text(text)
        match = BLOCK.search(text)
        assert match
    assert match.group(2) == reference_tables(), (
        "docs/reference/settings.md does not show the settings declared in "
        f"django_pgjobs/conf/__init__.py; regenerate its tables with: {REGENERATE}"
    )


def test_every_declaration_is_complete() -> None:
    assert [s.name for s in SETTINGS] == list(DEFAULTS)
    for setting in SETTINGS:
        assert setting.doc.endswith("."), setting.name
        assert "|" not in setting.doc, f"{setting.name}: a | would split the table's row"
        assert setting.parse(setting.default) is not None or setting.default is None
    for variable in ENVIRONMENT:
        assert variable.name.startswith("PGJOBS_") and variable.doc.endswith(".")
        variable.parser.parse(variable.default, variable.name)
