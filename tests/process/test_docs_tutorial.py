"""The tutorial performed as a reader does, in a fresh project against a fresh
database: every file it shows written, every command it shows run, and what each
prints compared with the page (worker ids, dates and retry delays normalised). Its
steps are read by tests/unit/test_docs.py."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.conftest import wait_until
from tests.helpers.docs_pages import (
    Command,
    FileEdit,
    matches,
    tutorial_steps,
)

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
        from tests.helpers.docs_pages import tutorial_project_files

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
