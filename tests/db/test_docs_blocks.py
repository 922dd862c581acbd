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

import pytest
from django.db import connection, transaction

from tests.helpers.docs_pages import Block, block_ids, marked

# --------------------------------------------------------------------------- runners


@pytest.mark.django_db
@pytest.mark.parametrize("block", marked("sql"), ids=block_ids(marked("sql")))
def test_sql_blocks_run(block: Block) -> None:
    """Run against the test database in a transaction that is rolled back."""
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in filter(str.strip, re.sub(r"--[^\n]*", "", block.body).split(";")):
            cursor.execute(statement.replace("%", "%%"))
        transaction.set_rollback(True)
