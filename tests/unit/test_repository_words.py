"""The repository speaks to the people who clone it (no database needed).

* No words of how its authors organise their work, and no references to a contract
  document a reader cannot open: the pages under ``docs/`` state the promises, and
  code refers to them.
* Code comments say why, not when: no issue numbers and no dates in them (dated
  measurements belong in ``bench/journal/``, release history in the changelog).
* The user pages stay short enough to read: the performance page, the guarantees page
  and the README have a ceiling of lines each.
* The changelog has one "Unreleased" section, and it names the version the package
  says it is becoming.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from django_pgjobs.version import __version__
from tests.conftest import ROOT

# Written with \s and a bracket so that this file does not match itself.
PROCESS_WORDS = re.compile(r"stop\s[0-9]|rehear[s]|SPEC\s§|spec\ssection", re.IGNORECASE)
#: A comment that names an issue or a date.
DATED_COMMENT = re.compile("#.*(" + "iss" r"ue #?[0-9]" + "|" + r"20[0-9]{2}-[0-9]{2}" + ")")
#: Files whose ``#`` starts a comment (Python, shell, TOML, INI).
CODE_SUFFIXES = {".py", ".sh", ".toml", ".ini", ".cfg", ".yml", ".yaml"}
#: Extensionless scripts.
CODE_SCRIPTS = {".ci/run", "bench/run", "scripts/dev", "scripts/check-package"}

LIMITS = {
    "docs/explanation/performance.md": 300,
    "docs/explanation/guarantees.md": 450,
    "README.md": 220,
}


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / name for name in out.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return None


def test_no_words_of_the_team_s_process_anywhere() -> None:
    offenders = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if PROCESS_WORDS.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert offenders == [], "say it for a reader of the repository:\n" + "\n".join(offenders)


def is_code(path: Path) -> bool:
    relative = path.relative_to(ROOT).as_posix()
    return path.suffix in CODE_SUFFIXES or relative in CODE_SCRIPTS


def test_no_issue_number_or_date_in_a_code_comment() -> None:
    offenders = []
    for path in filter(is_code, tracked_files()):
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if DATED_COMMENT.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert offenders == [], (
        "a comment says why, not when (measurements: bench/journal/; history: the "
        "changelog):\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize("page", sorted(LIMITS))
def test_user_pages_stay_short(page: str) -> None:
    lines = len((ROOT / page).read_text().splitlines())
    assert lines <= LIMITS[page], (
        f"{page} has {lines} lines, over {LIMITS[page]}: move dated measurements to "
        "bench/journal/ and history to the changelog"
    )


def test_one_unreleased_changelog_section_names_the_coming_version() -> None:
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "changelog.md").read_text(), re.M)
    unreleased = [h for h in headings if h.lower().startswith("unreleased")]
    assert len(unreleased) == 1, f"one Unreleased section, found {unreleased}"
    assert headings[0] == unreleased[0], "the Unreleased section comes first"
    named = re.fullmatch(r"Unreleased \((\d+\.\d+\.\d+)\)", unreleased[0])
    assert named, f"the Unreleased heading names its version: {unreleased[0]!r}"
    coming = named[1]
    assert re.fullmatch(rf"{re.escape(coming)}(\.dev\d+|rc\d+)", __version__), (
        f"django_pgjobs/version.py says {__version__}, the changelog is heading for {coming}"
    )
    released = [h for h in headings[1:] if h.split()[0] == coming]
    assert released == [], f"{coming} is both unreleased and released: {released}"
