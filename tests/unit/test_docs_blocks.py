"""Every fenced code block of ``docs/howto/`` and ``docs/tutorial/`` runs in a test, or
says in the page's source why it cannot; the settings and job blocks run here (the SQL
blocks: tests/db/test_docs_blocks.py; the commands: tests/process/test_docs_commands.py)."""

from __future__ import annotations

import re
import sys
import types
from typing import Any

import django
import pytest

from tests.helpers.docs_pages import Block, block_ids, blocks, marked

RUNNABLE = ("settings", "jobs", "sql", "command", "tutorial-project")


def run_by_tutorial(block: Block) -> bool:
    if block.page.parent.name != "tutorial" or not re.match(r"\d", block.page.name):
        return False
    if block.lang == "console":
        return True
    return block.lang == "python" and bool(
        re.match(r"# \S+\.py( \(add at the end\))?\n", block.body)
    )


def test_every_block_is_covered() -> None:
    problems = []
    for block in blocks():
        if block.marker == "not-run":
            if len(block.arg) < 10:
                problems.append(f"{block.where}: not-run needs a reason")
        elif block.marker == "doc-test":
            if block.arg.split()[0] not in RUNNABLE:
                problems.append(f"{block.where}: unknown doc-test kind {block.arg!r}")
        elif not run_by_tutorial(block):
            problems.append(
                f"{block.where}: ```{block.lang} block neither runs in a test nor "
                "says why not (<!-- doc-test: KIND --> or <!-- not-run: REASON -->)"
            )
    assert not problems, "\n".join(problems)


def _namespace(block: Block) -> dict[str, Any]:
    from django_pgjobs import job

    name = "docs_" + re.sub(r"\W", "_", block.where)
    module = types.ModuleType(name)
    sys.modules[name] = module
    namespace = module.__dict__
    namespace.update(
        job=job,
        INSTALLED_APPS=["django.contrib.admin"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql"}},
    )
    return namespace


@pytest.mark.parametrize("block", marked("settings"), ids=block_ids(marked("settings")))
def test_settings_blocks_are_valid_settings(block: Block) -> None:
    """Executed as a settings file; its ``PGJOBS`` passes the system check's validation."""
    from django_pgjobs.conf import settings_errors

    namespace = _namespace(block)
    exec(compile(block.body, block.where, "exec"), namespace)  # noqa: S102
    assert isinstance(namespace["DATABASES"], dict)
    if "PGJOBS" in namespace:
        assert [str(e) for e in settings_errors(namespace["PGJOBS"])] == []
    if "TASKS" in namespace and django.VERSION >= (6, 0):  # the Tasks framework's Django
        from django.utils.module_loading import import_string

        for config in namespace["TASKS"].values():
            import_string(config["BACKEND"])


@pytest.mark.parametrize("block", marked("jobs"), ids=block_ids(marked("jobs")))
def test_job_definitions_register(block: Block) -> None:
    """Executed as a jobs module: every ``@job`` in it is valid and registers."""
    from django_pgjobs.jobs import registry

    before = {d.name for d in registry.all_definitions()}
    namespace = _namespace(block)
    try:
        exec(compile(block.body, block.where, "exec"), namespace)  # noqa: S102
        added = {d.name for d in registry.all_definitions()} - before
        assert added, f"{block.where}: no @job was registered"
    finally:
        for name in {d.name for d in registry.all_definitions()} - before:
            registry.unregister(name)
