"""The documentation tells the truth.

* ``test_reference_covers_*``: every public name of the package (the names users
  import, settings keys, management commands and their options, check IDs, job
  options, model fields, statuses, signals, exceptions) is mentioned in a code span
  or code block of ``docs/reference/*.md``. A name added to the code without a
  reference entry fails here, naming it.
* ``test_tutorial``: performs the tutorial (``docs/tutorial/*.md``) in a fresh
  project against a fresh database: writes every file the tutorial shows, runs
  every command it shows, and checks that each command prints what the page says
  (worker ids, dates and retry delays are normalised).

The Sphinx build itself (warnings as errors, internal links checked) runs in CI
as ``scripts/dev docs``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shlex
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from django.core.management import load_command_class
from django.db import connection
from django.dispatch import Signal

from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
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

#: Parts of an output line that change from run to run.
NORMALISE = [
    (re.compile(r"worker \S+:\d+:[0-9a-f]{8}"), "worker <id>"),
    (re.compile(r"retrying in \d+(\.\d+)?s"), "retrying in <delay>s"),
    (re.compile(r"^Date: .*"), "Date: <date>"),
    (re.compile(r"^Message-ID: .*"), "Message-ID: <message-id>"),
]


def normalise(line: str) -> str:
    line = line.rstrip()
    for pattern, replacement in NORMALISE:
        line = pattern.sub(replacement, line)
    return line


MIME_HEADER = re.compile(r"^(Content-Type|MIME-Version|Content-Transfer-Encoding): ")


def sort_mime_headers(lines: list[str]) -> list[str]:
    """The email package orders these three headers differently across Python
    versions; compare each run of them as a sorted block."""
    out: list[str] = []
    block: list[str] = []
    for line in [*lines, ""]:
        if MIME_HEADER.match(line):
            block.append(line)
            continue
        out.extend(sorted(block))
        block = []
        out.append(line)
    return out[:-1]


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


def _console(text: str, where: str) -> Iterator[Command]:
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


BLOCK = re.compile(
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
        for m in BLOCK.finditer(text):
            where = f"{page.name}:{text[: m.start()].count(chr(10)) + 1}"
            if m["hidden"] is not None:
                steps += _console(m["hidden"], where)
            elif m["lang"] == "console":
                steps += _console(m["body"], where)
            elif m["lang"] == "python":
                first, _, rest = m["body"].partition("\n")
                header = re.match(r"# (\S+\.py)( \(add at the end\))?$", first)
                if header:
                    steps.append(FileEdit(header[1], rest, bool(header[2]), where))
    return steps


def test_tutorial_parses() -> None:
    steps = tutorial_steps()
    commands = [s.line for s in steps if isinstance(s, Command)]
    assert any("runjobs --burst" in c for c in commands)
    assert any("retry_jobs --ids" in c for c in commands)  # the public API, not sql.*
    assert any(isinstance(s, FileEdit) and s.path == "shop/jobs.py" for s in steps)
    assert matches(["a", "...", "c"], ["a", "b", "b2", "c"])
    assert not matches(["a", "c"], ["a", "b", "c"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tutorial:
    """Runs the tutorial's steps in ``project`` against ``database_url``."""

    def __init__(self, project: Path, database_url: str):
        self.project = project
        self.port = _free_port()
        self.server: subprocess.Popen[bytes] | None = None
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "PGJOBS_", "PYTEST_"))
        }
        self.env.update(
            DATABASE_URL=database_url,
            PYTHONUNBUFFERED="1",
            PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            DJANGO_SUPERUSER_PASSWORD="tutorial-password",
        )

    def run(self, command: Command) -> list[str] | None:
        """Run one command; its output lines, or None for a step this test cannot run."""
        argv = shlex.split(command.line)
        if argv[0] in ("pip", "source") or argv[:3] == ["python", "-m", "venv"]:
            return None  # the package under test is already installed in this interpreter
        if argv[0] == "curl":
            return self.curl(argv)
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "django-admin":
            argv[:1] = [sys.executable, "-m", "django"]
        if argv[1:3] == ["manage.py", "runserver"]:
            self.start_server(argv)
            return None
        if argv[1:3] == ["manage.py", "createsuperuser"]:
            argv.append("--noinput")
        proc = subprocess.run(
            argv,
            cwd=self.project,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
        output = proc.stdout.decode(errors="replace")
        assert proc.returncode == 0, (
            f"{command.where}: `{command.line}` exited {proc.returncode}:\n{output}"
        )
        return output.splitlines()

    def start_server(self, argv: list[str]) -> None:
        self.server = subprocess.Popen(
            [*argv, f"127.0.0.1:{self.port}", "--noreload"],
            cwd=self.project,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_until(answers, timeout=30, message="runserver to listen")

    def curl(self, argv: list[str]) -> list[str]:
        """``curl -X POST -d k=v URL``, done with urllib on the test server's port."""
        data: list[str] = []
        url = ""
        args = iter(argv[1:])
        for arg in args:
            if arg == "-d":
                data.append(next(args))
            elif arg == "-X":
                next(args)
            elif arg.startswith("http"):
                url = arg.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")
        assert self.server is not None, "the tutorial uses curl before starting runserver"
        body = "&".join(data).encode()
        with urllib.request.urlopen(url, data=body, timeout=30) as response:  # noqa: S310
            return response.read().decode().splitlines()

    def write(self, edit: FileEdit) -> None:
        path = self.project / edit.path
        assert path.parent.is_dir(), f"{edit.where}: {edit.path}'s folder does not exist yet"
        if edit.append:
            with path.open("a") as fh:
                fh.write("\n" + edit.text)
        else:
            path.write_text(edit.text)

    def close(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=10)


def _tutorial_database_url(name: str) -> str:
    parts = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


@pytest.mark.process
@pytest.mark.timeout(600)  # minutes on a loaded box: more than the default 300 s
def test_tutorial(other_connection: psycopg.Connection, tmp_path: Path) -> None:
    """Every tutorial command, run in order, prints what the tutorial shows."""
    name = f"{connection.settings_dict['NAME']}_tutorial"
    other_connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    other_connection.execute(f'CREATE DATABASE "{name}"')
    project = tmp_path / "project"
    project.mkdir()
    tutorial = Tutorial(project, _tutorial_database_url(name))
    ran: list[str] = []
    try:
        for step in tutorial_steps():
            if isinstance(step, FileEdit):
                tutorial.write(step)
                continue
            output = tutorial.run(step)
            if output is None:
                continue
            ran.append(step.line.split("\n")[0])
            if not step.expected:
                continue
            # Blank lines and the order of MIME headers differ between Python and
            # Django versions (the console email backend); they carry no meaning here.
            expected = sort_mime_headers([normalise(x) for x in step.expected if x.strip()])
            actual = sort_mime_headers([normalise(x) for x in output if x.strip()])
            assert matches(expected, actual), (
                f"{step.where}: `{step.line}` printed\n"
                + "\n".join(output)
                + "\n\nbut the tutorial shows\n"
                + "\n".join(step.expected)
            )
        # The how-tos' blocks marked `doc-test: tutorial-project PATH` (test-your-jobs.md)
        # are tests for this project: write them and run them with Django's runner.
        from tests.test_docs_blocks import tutorial_project_files

        files = tutorial_project_files()
        assert "shop/tests.py" in files
        for path, text in files.items():
            (project / path).write_text(text)
        output = tutorial.run(Command("python manage.py test shop -v 2", where="how-tos"))
        assert output is not None and "OK" in output, output
        ran.append("manage.py test shop")
    finally:
        tutorial.close()
        other_connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert any("runjobs --max-jobs" in line for line in ran), ran
