"""The documentation tells the truth.

* ``test_reference_covers_*``: every public name of the package (the names users
  import, settings keys, management commands and their options, check IDs, job
  options, model fields, statuses, signals, exceptions) is mentioned in a code span
  or code block of ``docs/reference/*.md``. A name added to the code without a
  reference entry fails here, naming it.
* ``test_tutorial_parses``: the tutorial (``docs/tutorial/*.md``) reads as the steps
  that ``tests/process/test_docs_tutorial.py`` performs in a fresh project against a
  fresh database (writing every file it shows, running every command it shows and
  comparing what each prints with the page).

The Sphinx build itself (warnings as errors, internal links checked) runs in CI
as ``scripts/dev docs``.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from django.core.management import load_command_class
from django.dispatch import Signal

from tests.helpers.docs_pages import Command, FileEdit, matches, tutorial_steps

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "django_pgjobs"

# --------------------------------------------------------------------------- reference


FENCE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1", re.M | re.S)


def _reference_code() -> str:
    """All inline code spans and fenced code blocks of docs/reference/*.md, joined."""
    parts: list[str] = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        text = page.read_text()
        parts += [m[1] for m in FENCE.findall(text)]
        parts += re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    return "\n".join(parts)


def _missing(names: set[str]) -> list[str]:
    code = _reference_code()
    return sorted(n for n in names if not re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", code))


def _defined_names(module_name: str) -> set[str]:
    """Public classes, functions and signals defined in (not imported into) a module."""
    module = importlib.import_module(module_name)
    names = set()
    for name, obj in vars(module).items():
        if name.startswith("_"):
            continue
        if isinstance(obj, Signal) or (
            (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", None) == module_name
        ):
            names.add(name)
    return names


def test_reference_covers_public_modules() -> None:
    import django_pgjobs

    names = set(django_pgjobs.__all__)
    for module in ("models", "signals", "exceptions", "testing", "jobs.context"):
        names |= _defined_names(f"django_pgjobs.{module}")
    # JobContext's fields and methods, and the manager's querysets.
    from django_pgjobs.jobs.context import JobContext
    from django_pgjobs.jobs.managers import JobManager, JobQuerySet

    names |= {n for n in vars(JobContext) if not n.startswith("_")}
    names |= {n for n in JobContext.__dataclass_fields__ if not n.startswith("_")}
    names |= {n for n in vars(JobManager) if not n.startswith("_")}
    names |= {n for n in vars(JobQuerySet) if not n.startswith("_")}
    names |= {"JobFunction", "JobDefinition", "enqueue_many", "using"}  # what @job returns
    assert not _missing(names), f"public names missing from docs/reference: {_missing(names)}"


def test_reference_covers_settings_checks_and_options() -> None:
    from django_pgjobs.conf import DEFAULTS
    from django_pgjobs.jobs.definition import JOB_OPTIONS
    from django_pgjobs.states import JobStatus
    from django_pgjobs.support.validation import CALL_OPTIONS

    names = set(DEFAULTS) | set(JOB_OPTIONS) | set(CALL_OPTIONS)
    names |= {s.value for s in JobStatus}
    check_ids: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        check_ids |= set(re.findall(r"django_pgjobs\.[EW]\d{3}", path.read_text()))
    assert check_ids, "found no check IDs in django_pgjobs/ (has checks.py moved?)"
    names |= check_ids
    assert not _missing(names), f"missing from docs/reference: {_missing(names)}"


def test_reference_covers_tables() -> None:
    from django_pgjobs.models import Job, JobResult, Worker

    names: set[str] = set()
    for model in (Job, JobResult, Worker):
        names.add(model._meta.db_table)
        names |= {f.column for f in model._meta.concrete_fields}
        names |= {i.name for i in model._meta.indexes}
        names |= {c.name for c in model._meta.constraints}
    # SQL functions created by migrations (pgjobs_enqueue).
    for path in (PACKAGE / "migrations").glob("*.py"):
        names |= set(re.findall(r"FUNCTION\s+(?:public\.)?(\w+)\s*\(", path.read_text(), re.I))
    assert not _missing(names), f"missing from docs/reference: {_missing(names)}"


DJANGO_OPTIONS = {
    "--help",
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


def _commands() -> list[str]:
    return sorted(
        p.stem
        for p in (PACKAGE / "management" / "commands").glob("*.py")
        if not p.stem.startswith("_")
    )


def test_reference_covers_management_commands() -> None:
    names: set[str] = set()
    for name in _commands():
        names.add(name)
        parser = load_command_class("django_pgjobs", name).create_parser("manage.py", name)
        for action in parser._actions:
            names |= {
                o for o in action.option_strings if o.startswith("--") and o not in DJANGO_OPTIONS
            }
    assert len(names) > 2
    assert not _missing(names), f"commands/options missing from docs/reference: {_missing(names)}"


# --------------------------------------------------------------------------- tutorial


def test_tutorial_parses() -> None:
    steps = tutorial_steps()
    commands = [s.line for s in steps if isinstance(s, Command)]
    assert any("runjobs --burst" in c for c in commands)
    assert any("retry_jobs --ids" in c for c in commands)  # the public API, not sql.*
    assert any(isinstance(s, FileEdit) and s.path == "shop/jobs.py" for s in steps)
    assert matches(["a", "...", "c"], ["a", "b", "b2", "c"])
    assert not matches(["a", "c"], ["a", "b", "c"])
