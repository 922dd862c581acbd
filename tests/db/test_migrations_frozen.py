"""The migrations: one squashed migration replaces the series 0001-0015, and each SQL
function (pgjobs_enqueue, the workflow trigger's) is written once, in db/, which the
migration runs; the installed functions are the ones the code expects."""

from __future__ import annotations

import pytest
from django.db import connection

from django_pgjobs.models import Job


@pytest.mark.django_db
def test_the_workflow_trigger_is_installed_on_the_jobs_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname, tgenabled FROM pg_trigger"
            " WHERE tgrelid = 'django_pgjobs_job'::regclass AND NOT tgisinternal"
        )
        rows = cursor.fetchall()
    assert rows == [("pgjobs_workflow_step", "O")]


@pytest.mark.django_db
def test_the_installed_function_pins_its_search_path() -> None:
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT n.nspname, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE p.proname = 'pgjobs_enqueue'""")
        rows = cursor.fetchall()
        cursor.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.oid = 'django_pgjobs_job'::regclass"
        )
        (table_schema,) = cursor.fetchone()
    assert rows == [(table_schema, ["search_path=pg_catalog, pg_temp"])]


@pytest.mark.django_db
def test_another_search_path_still_writes_the_jobs_table() -> None:
    """A caller (pg_cron, a trigger) whose search_path finds another django_pgjobs_job
    first still enqueues into the real one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT quote_ident(current_schema())")
        (schema,) = cursor.fetchone()
        cursor.execute("CREATE SCHEMA decoy")
        cursor.execute(
            "CREATE TABLE decoy.django_pgjobs_job (LIKE django_pgjobs_job INCLUDING ALL)"
        )
        cursor.execute(f"SET LOCAL search_path = decoy, {schema}")
        cursor.execute(f"SELECT {schema}.pgjobs_enqueue('tests.testapp.jobs.noop')")
        (new_id,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM decoy.django_pgjobs_job")
        (in_decoy,) = cursor.fetchone()
        cursor.execute(f"SET LOCAL search_path = {schema}")
    assert in_decoy == 0
    assert Job.objects.filter(pk=new_id, task="tests.testapp.jobs.noop").exists()
