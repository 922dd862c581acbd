"""Every fenced code block of ``docs/howto/`` and ``docs/tutorial/`` runs in a test, or
says in the page's source why it cannot.

A block is covered when it is

* a step of the tutorial (``docs/tutorial/[0-9]*.md``: console blocks and python blocks
  headed ``# path.py``), which ``tests/process/test_docs_tutorial.py`` performs; or
* preceded by ``<!-- doc-test: KIND [ARG] -->``, run here by the runner of that kind
  (``settings``, ``jobs``, ``sql``; ``command`` in ``tests/process/test_docs_commands.py``) or, for ``tutorial-project PATH``, added
  to the tutorial's project and run with ``manage.py test`` by ``test_tutorial``; or
* preceded by ``<!-- not-run: REASON -->`` (a systemd unit, a manifest for a cluster,
  output shown for reading...).

``test_every_block_is_covered`` fails naming any block that is none of these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection, transaction

from tests.conftest import ROOT

DOCS = ROOT / "docs"
FENCE = re.compile(
    r"^(?P<fence>`{3,}|~{3,})(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S
)
MARKER = re.compile(r"<!--\s*(doc-test|not-run):\s*(.*?)\s*-->\s*$", re.S)


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: str
    marker: str | None  # "doc-test" / "not-run" / None
    arg: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for folder in ("howto", "tutorial"):
        for page in sorted((DOCS / folder).glob("*.md")):
            text = page.read_text()
            for m in FENCE.finditer(text):
                if text[m.end("lang") : m.end("lang") + 1] == "{" or m["lang"] == "mermaid":
                    continue  # a MyST directive ({toctree}) or a diagram, not code
                before = text[: m.start()].rstrip()
                tail = before[before.rfind("<!--") :] if before.endswith("-->") else ""
                marker = MARKER.match(tail)
                out.append(
                    Block(
                        page,
                        text[: m.start()].count("\n") + 1,
                        m["lang"],
                        m["body"],
                        marker[1] if marker else None,
                        marker[2] if marker else "",
                    )
                )
    return out


def marked(kind: str) -> list[Block]:
    return [b for b in blocks() if b.marker == "doc-test" and b.arg.split()[0] == kind]


def _ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


# --------------------------------------------------------------------------- runners


@pytest.mark.django_db
@pytest.mark.parametrize("block", marked("sql"), ids=_ids(marked("sql")))
def test_sql_blocks_run(block: Block) -> None:
    """Run against the test database in a transaction that is rolled back."""
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in filter(str.strip, re.sub(r"--[^\n]*", "", block.body).split(";")):
            cursor.execute(statement.replace("%", "%%"))
        transaction.set_rollback(True)


def tutorial_project_files() -> dict[str, str]:
    """``doc-test: tutorial-project PATH`` blocks, joined per file, in reading order."""
    files: dict[str, str] = {}
    for block in marked("tutorial-project"):
        path = block.arg.split()[1]
        files[path] = files.get(path, "") + block.body + "\n\n"
    return files
