"""enqueue joins the caller's transaction: invisible to others until commit, gone on rollback."""

from __future__ import annotations

import pytest

from django_pgjobs.backend import TASKS_AVAILABLE

if not TASKS_AVAILABLE:
    pytest.skip(
        "django.tasks needs Django >= 6.0; only test_import runs on this Django",
        allow_module_level=True,
    )

import psycopg
from django.db import transaction
from django.tasks.exceptions import TaskResultDoesNotExist

from tests.tasks_backend import tasks as t


def _visible(conn: psycopg.Connection, result_id: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM django_pgjobs_job WHERE id = %s", [int(result_id)]
    ).fetchone()
    return bool(row and row[0])


def test_row_invisible_until_commit(other_connection: psycopg.Connection) -> None:
    with transaction.atomic():
        result = t.noop_task.enqueue()
        assert t.noop_task.get_result(result.id) == result  # the caller sees its own row
        assert not _visible(other_connection, result.id)
    assert _visible(other_connection, result.id)


def test_row_gone_on_rollback(other_connection: psycopg.Connection) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        result = t.noop_task.enqueue()
        raise Boom
    assert not _visible(other_connection, result.id)
    with pytest.raises(TaskResultDoesNotExist):
        t.noop_task.get_result(result.id)
