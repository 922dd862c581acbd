"""The architecture page's map stays true: every file it names exists, every module of
the package is on the map, every ``Class.method`` / function / statement it attributes
to a file is defined there, and each path of the one-minute test is a chain of calls
that the code really makes.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

from django_pgjobs.db.tables import JOB

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "explanation" / "architecture.md"
PACKAGE = ROOT / "django_pgjobs"

FILE_REF = re.compile(r"`((?:django_pgjobs|tests|docs)/[\w/.-]+\.(?:py|md))`")
# `Name` or `Class.method` written right before "in `path.py`" (the path of one job).
SYMBOL_IN_FILE = re.compile(r"`([\w.]+)`\s+in\s+`(django_pgjobs/[\w/]+\.py)`")
# | `path.py` (`symbol`) ...  in the one-minute table.
FILE_THEN_SYMBOL = re.compile(r"`(django_pgjobs/[\w/]+\.py)`\s+\(`([\w.]+)`\)")


def page() -> str:
    return PAGE.read_text()


# A SQL function created by a statement of db/ (``CREATE OR REPLACE FUNCTION
# @SCHEMA@.pgjobs_workflow_step(``).
SQL_FUNCTION = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION (?:@SCHEMA@\.)?(\w+)\(")


@functools.cache  # each file parsed once per run: the paths check every step's file
def definitions(path: Path) -> dict[str, str]:
    """Every name ``path`` defines, with its source: top-level functions and classes,
    ``Class.method``, module-level constants (the statements of db/) and the SQL
    functions those statements create."""
    text = path.read_text()
    tree = ast.parse(text)
    found: dict[str, str] = {}
    for node in tree.body:
        source = ast.get_source_segment(text, node) or ""
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = source
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[f"{node.name}.{item.name}"] = ast.get_source_segment(text, item) or ""
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for target in targets:
            if isinstance(target, ast.Name):
                found[target.id] = source
                for match in SQL_FUNCTION.finditer(source):
                    found[match[1]] = source
    return found


@functools.cache
def defined_names(path: Path) -> set[str]:
    return set(definitions(path))


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


# ---------------------------------------------------------------- the one-minute test

# One step of a path: `Name` in `django_pgjobs/file.py`; between two steps, "→" (calls)
# or "⇒" (its UPDATE of the jobs table fires this trigger function).
STEP = re.compile(r"`([\w.]+)` in `(django_pgjobs/[\w/]+\.py)`")
LINKS = {"→": "calls", "⇒": "fires"}
#: What a newcomer must find in a minute, each a bold row of the table.
SIX = (
    "the claim",
    "the completer",
    "the heartbeat",
    "the reaper",
    "the settings table",
    "the workflow release",
)


def one_minute_rows() -> dict[str, str]:
    text = page()
    section = text[text.index("## The one-minute test") : text.index("## The map")]
    rows = {}
    for line in section.splitlines():
        bold = re.match(r"\| \*\*(.+?)\*\*", line)
        if bold:
            rows[bold[1]] = line
    return rows


def paths(row: str) -> list[list[tuple[str, str, str]]]:
    """The chains of steps in ``row``: lists of (link to the previous step, name, file)."""
    chains: list[list[tuple[str, str, str]]] = []
    previous_end = None
    for match in STEP.finditer(row):
        between = row[previous_end : match.start()].strip() if previous_end is not None else ""
        if between in LINKS and chains:
            chains[-1].append((LINKS[between], match[1], match[2]))
        else:
            chains.append([("", match[1], match[2])])
        previous_end = match.end()
    return chains


def broken_links(chain: list[tuple[str, str, str]]) -> list[str]:
    """Each step of ``chain`` defined in its file, and calling (or firing) the next."""
    wrong = []
    for index, (link, name, path) in enumerate(chain):
        defined = definitions(ROOT / path)
        if name not in defined:
            wrong.append(f"{name} is not defined in {path}")
            continue
        if index == 0:
            continue
        _, before, before_path = chain[index - 1]
        source = definitions(ROOT / before_path).get(before, "")
        if link == "calls" and not re.search(rf"\b{re.escape(name.split('.')[-1])}\b", source):
            wrong.append(f"{before} ({before_path}) does not call {name}")
        if link == "fires":
            wrong += not_fired(before, before_path, name, path)
    return wrong


def not_fired(statement: str, statement_path: str, function: str, path: str) -> list[str]:
    """Why ``statement`` (a constant of db/) does not fire the trigger ``function`` (a SQL
    function created by a statement of ``path``): read from their texts as they run."""
    module = importlib.import_module(statement_path.removesuffix(".py").replace("/", "."))
    text = getattr(module, statement, "")
    wrong = []
    if not re.search(rf"\bUPDATE\s+(?:\S+\.)?{JOB}\b", text):
        wrong.append(f"{statement} ({statement_path}) updates no row of {JOB}")
    trigger = re.compile(
        rf"CREATE TRIGGER \w+ AFTER UPDATE ON (?:\S+\.)?{JOB}\b[^;]*?"
        rf"EXECUTE FUNCTION (?:\S+\.)?{re.escape(function)}\(\)"
    )
    texts = vars(importlib.import_module(path.removesuffix(".py").replace("/", "."))).values()
    if not any(isinstance(t, str) and trigger.search(t) for t in texts):
        wrong.append(f"no trigger on {JOB} runs {function} in {path}")
    return wrong


def test_the_one_minute_test_gives_a_path_of_functions_for_each_of_the_six() -> None:
    rows = one_minute_rows()
    missing = [what for what in SIX if what not in rows]
    assert not missing, f"the one-minute test lost its row for {missing}"
    for what in SIX:
        chains = paths(rows[what])
        longest = max((len(chain) for chain in chains), default=0)
        assert longest >= 3, f"{what}: no path of three or more named functions on the page"
        wrong = [problem for chain in chains if len(chain) > 1 for problem in broken_links(chain)]
        assert not wrong, f"{what}: the path on the page does not match the code: {wrong}"


#: The most modules one job's trip (enqueue, claim, run, outcome) may cross.
TRIP_MODULES = 12


def test_one_jobs_trip_is_a_path_of_calls_through_at_most_twelve_modules() -> None:
    row = one_minute_rows()["one job's trip"]
    chains = paths(row)
    wrong = [problem for chain in chains if len(chain) > 1 for problem in broken_links(chain)]
    assert not wrong, f"one job's trip on the page does not match the code: {wrong}"
    modules = {path for chain in chains for _, _, path in chain}
    assert {
        "django_pgjobs/jobs/enqueue.py",
        "django_pgjobs/db/store.py",
        "django_pgjobs/db/job_outcome.py",
    } <= modules
    assert len(modules) <= TRIP_MODULES, sorted(modules)
    assert f"through {len(modules)} modules" in row, "the row's count is not the path's"


def test_a_path_that_no_longer_matches_the_code_fails() -> None:
    # The check itself: a call that is not made, a name that is not there, a trigger
    # that does not exist.
    claimer = "django_pgjobs/worker/claimer.py"
    assert broken_links(
        [("", "Claimer.claim_loop", claimer), ("calls", "Claimer.release", claimer)]
    ) == [f"Claimer.claim_loop ({claimer}) does not call Claimer.release"]
    assert broken_links([("", "Claimer.claim_loop", claimer), ("calls", "no_such", claimer)]) == [
        f"no_such is not defined in {claimer}"
    ]
    outcome = "django_pgjobs/db/job_outcome.py"
    assert broken_links([("", "JOB_COMPLETE_MANY", outcome), ("fires", "job_retry", outcome)])
    trigger = "django_pgjobs/db/workflow_trigger.py"
    assert not_fired("RESULT_BY_KEY", outcome, "pgjobs_workflow_trigger", trigger) == [
        f"RESULT_BY_KEY ({outcome}) updates no row of {JOB}"
    ]
    assert not broken_links(
        [
            ("", "Completer.write_batch", "django_pgjobs/worker/completer.py"),
            ("calls", "Completer._write_rows", "django_pgjobs/worker/completer.py"),
        ]
    )
