"""The command blocks of the docs (``<!-- doc-test: command -->``) run as a reader
runs them (the other blocks: tests/db/test_docs_blocks.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from django.db import connection

from tests.conftest import ROOT
from tests.helpers.docs_pages import Block, block_ids, marked


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("block", marked("command"), ids=block_ids(marked("command")))
def test_command_blocks_run(block: Block) -> None:
    """Each ``$ python manage.py ...`` line runs against the test database and exits 0."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "PGJOBS_WORKER_DB_NAME": connection.settings_dict["NAME"],
    }
    lines = [line[2:] for line in block.body.splitlines() if line.startswith("$ ")]
    assert lines, f"{block.where}: no $ command"
    for line in lines:
        argv = shlex.split(line.split("  #")[0])
        assert argv[:2] == ["python", "manage.py"], f"{block.where}: {line}"
        proc = subprocess.run(
            [sys.executable, "-m", "django", *argv[2:]],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode in (0, 1) if "--check" in argv else proc.returncode == 0, (
            f"{block.where}: `{line}` exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )
