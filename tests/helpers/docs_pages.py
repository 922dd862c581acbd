"""The docs' pages read as what the docs tests run: the fenced code blocks of the
how-tos and the tutorial with their markers, and the tutorial's steps in reading order."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

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


def block_ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


def tutorial_project_files() -> dict[str, str]:
    """``doc-test: tutorial-project PATH`` blocks, joined per file, in reading order."""
    files: dict[str, str] = {}
    for block in marked("tutorial-project"):
        path = block.arg.split()[1]
        files[path] = files.get(path, "") + block.body + "\n\n"
    return files


def matches(expected: list[str], actual: list[str]) -> bool:
    """``expected`` equals ``actual`` where a ``...`` line stands for any lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


@dataclass
class Command:
    line: str
    expected: list[str] = field(default_factory=list)
    where: str = ""


@dataclass
class FileEdit:
    path: str
    text: str
    append: bool
    where: str = ""


def console_commands(text: str, where: str) -> Iterator[Command]:
    lines = text.splitlines()
    i = 0
    current: Command | None = None
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            if current:
                yield current
            command = line[2:]
            while True:  # a command continues while its quotes are open
                try:
                    shlex.split(command)
                    break
                except ValueError:
                    i += 1
                    command += "\n" + lines[i]
            current = Command(command, where=where)
        elif current is not None:
            current.expected.append(line)
        i += 1
    if current:
        yield current


TUTORIAL_BLOCK = re.compile(
    r"^```(?P<lang>\w+)[^\n]*\n(?P<body>.*?)^```[ \t]*$"
    r"|<!-- tutorial-test:[^\n]*\n(?P<hidden>.*?)-->",
    re.M | re.S,
)


def tutorial_steps() -> list[Command | FileEdit]:
    """The tutorial's files and commands, in reading order."""
    steps: list[Command | FileEdit] = []
    pages = sorted((DOCS / "tutorial").glob("[0-9]*.md"))
    assert pages, "no tutorial pages found"
    for page in pages:
        text = page.read_text()
        for m in TUTORIAL_BLOCK.finditer(text):
            where = f"{page.name}:{text[: m.start()].count(chr(10)) + 1}"
            if m["hidden"] is not None:
                steps += console_commands(m["hidden"], where)
            elif m["lang"] == "console":
                steps += console_commands(m["body"], where)
            elif m["lang"] == "python":
                first, _, rest = m["body"].partition("\n")
                header = re.match(r"# (\S+\.py)( \(add at the end\))?$", first)
                if header:
                    steps.append(FileEdit(header[1], rest, bool(header[2]), where))
    return steps
