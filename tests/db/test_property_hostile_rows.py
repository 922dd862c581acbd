"""Property test: every stored value is hostile until decoded.

A hostile value written with raw SQL into one JSON column of one row (arguments,
trace context, error history, stored result, a worker's queue list) must fail only
that row: the worker runs the row's batch-mates and exits normally, the admin list
and detail pages answer 200, ``jobs_status`` (text and ``--json``) reports, and the
Tasks backend (Django >= 6.0) reads the row. A row whose arguments cannot be
decoded, or are not an array/object, is dead-lettered alone with a clear error.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DataError, connection, transaction
from django.test import Client
from django.urls import reverse
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_pgjobs.backend import TASKS_AVAILABLE
from django_pgjobs.models import Job, JobResult, Worker
from tests.conftest import examples
from tests.helpers.hostile_values import PROPERTY_SETTINGS, json_values, run_worker_burst
from tests.testapp.jobs import echo_value

pytestmark = pytest.mark.django_db(transaction=True)

#: JSON texts PostgreSQL stores and Python's json module cannot decode.
UNDECODABLE = [
    "[1e5000]",
    '{"k": -1e400}',
    "[" + "9" * 5000 + "]",
    "[" * 1000 + "]" * 1000,
    "[" * 3000 + "]" * 3000,
    '{"a":' * 3000 + "1" + "}" * 3000,
]


def _dumps(value: Any) -> str | None:
    """JSON text of ``value``; None for what JSON cannot say (NaN, infinities)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return None


#: Decodable, but of the wrong shape for the column.
WRONG_SHAPE = ["5", '"text"', "null", "true", "[]", "{}", '{"traceparent": 5}', "[[1], {}]"]
COLUMNS = ["args", "kwargs", "trace_context", "errors", "value", "worker_queues", "worker_tasks"]

hostile_texts = st.one_of(
    st.sampled_from(UNDECODABLE),
    st.sampled_from(WRONG_SHAPE),
    json_values.map(_dumps).filter(lambda t: t is not None and "\\u0000" not in t),
)


def _decodes(text: str) -> Any:
    """(decodable, value) of ``text`` as PostgreSQL gives it back (1e5000 comes back
    as 5,001 digits, which Python refuses to turn into an int)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb::text", [text])
        (stored,) = cursor.fetchone()
    try:
        return True, json.loads(stored)
    except (ValueError, RecursionError):
        return False, None


def _write(column: str, job_id: int, text: str) -> bool:
    """Store ``text`` (False: PostgreSQL refuses it, e.g. a lone surrogate escape)."""
    try:
        with transaction.atomic():
            _store(column, job_id, text)
    except DataError:
        return False
    return True


def _store(column: str, job_id: int, text: str) -> None:
    with connection.cursor() as cursor:
        if column == "value":  # a completed job's stored result
            cursor.execute(
                "UPDATE django_pgjobs_job SET status = 'completed', finished_at = now() "
                "WHERE id = %s",
                [job_id],
            )
            cursor.execute(
                "INSERT INTO django_pgjobs_jobresult (job_id, value, created_at) "
                "VALUES (%s, %s::jsonb, now())",
                [job_id, text],
            )
        elif column in ("worker_queues", "worker_tasks"):  # a live worker's row
            queues, tasks = (text, "[]") if column == "worker_queues" else ("[]", text)
            cursor.execute(
                "INSERT INTO django_pgjobs_worker (id, host, pid, queues, concurrency, "
                "started_at, last_seen, tasks) VALUES ('hostile-worker', 'h', 1, %s::jsonb, "
                "1, now(), now(), %s::jsonb)",
                [queues, tasks],
            )
        elif column == "args" and text == "null":  # NOT NULL: the nearest thing
            cursor.execute(
                "UPDATE django_pgjobs_job SET args = 'null'::jsonb WHERE id = %s", [job_id]
            )
        else:
            cursor.execute(
                f"UPDATE django_pgjobs_job SET {column} = %s::jsonb WHERE id = %s", [text, job_id]
            )


def _reports() -> None:
    for args in ((), ("--json",)):
        out = io.StringIO()
        call_command("jobs_status", *args, stdout=out)
        assert out.getvalue()


def _clean() -> None:
    Job.objects.all().delete()
    JobResult.objects.all().delete()
    Worker.objects.filter(id="hostile-worker").delete()


@settings(
    PROPERTY_SETTINGS, max_examples=examples(25)
)  # each example runs a worker, 7 pages, 2 reports
@given(column=st.sampled_from(COLUMNS), text=hostile_texts)
@example(column="trace_context", text="[" * 3000 + "]" * 3000)
@example(column="args", text="[1e5000]")
@example(column="kwargs", text='{"a":' * 3000 + "1" + "}" * 3000)
@example(column="errors", text="[" * 3000 + "]" * 3000)
@example(column="value", text="[" * 3000 + "]" * 3000)
@example(column="worker_queues", text="[1e5000]")
@example(column="worker_tasks", text="5")
@example(column="worker_tasks", text="[{}, null]")
def test_a_hostile_value_fails_only_its_row(admin_user: Any, column: str, text: str) -> None:
    _clean()
    client = Client()
    client.force_login(admin_user)
    before, hostile, after = (echo_value.enqueue(i) for i in range(3))
    if not _write(column, hostile.id, text):
        return  # not storable: nothing hostile got in
    run_worker_burst()  # exits normally: asserted inside
    for mate, i in ((before, 0), (after, 2)):
        row = Job.objects.get(id=mate.id)
        assert row.status == "completed", (row.status, row.last_error)
        assert JobResult.objects.get(job_id=mate.id).value == {"args": [i], "kwargs": {}}
    row = Job.objects.get(id=hostile.id)
    decodable, decoded = _decodes(text)
    wrong = (column == "args" and not isinstance(decoded, list)) or (
        column == "kwargs" and not isinstance(decoded, dict)
    )
    if column in ("args", "kwargs") and (not decodable or wrong):
        assert row.status == "dead" and row.attempts == 1, (row.status, row.last_error)
        assert "stored arg" in (row.last_error or ""), row.last_error
    elif column in ("args", "kwargs"):  # the job ran: its own outcome (kwargs it does
        # not take, a return value too deep to store), never a neighbour's
        assert row.status in ("completed", "dead"), (row.status, row.last_error)
        assert row.status == "completed" or ": " in (row.last_error or ""), row.last_error
    else:
        assert row.status == "completed", (row.status, row.last_error)
    listed = client.get(reverse("admin:django_pgjobs_job_changelist"))
    assert listed.status_code == 200
    for job in (before, hostile, after):
        detail = client.get(reverse("admin:django_pgjobs_job_change", args=[job.id]))
        assert detail.status_code == 200, job.id
    for page in ("job_overview", "worker_changelist", "queue_changelist"):
        assert client.get(reverse(f"admin:django_pgjobs_{page}")).status_code == 200, page
    if column.startswith("worker_"):
        page = reverse("admin:django_pgjobs_worker_change", args=["hostile-worker"])
        assert client.get(page).status_code == 200
    unknown = client.get(reverse("admin:django_pgjobs_job_changelist") + "?attention=unknown")
    assert unknown.status_code == 200
    _reports()


@pytest.mark.parametrize("column", ["args", "kwargs", "errors", "value"])
@pytest.mark.parametrize("text", UNDECODABLE[::2], ids=["huge", "digits", "deep"])
def test_the_tasks_backend_reads_a_hostile_row(column: str, text: str) -> None:
    if not TASKS_AVAILABLE:
        pytest.skip("the Tasks backend needs Django >= 6.0 (django.tasks); this is Django < 6")
    from django.tasks import default_task_backend

    from tests.tasks_backend import tasks as t

    result = t.echo.enqueue(1)
    _write(column, int(result.id), text)
    read = default_task_backend.get_result(result.id)
    assert read.id == result.id
    if column == "args":
        assert read.args == [f"<undecodable: {'RecursionError' if '[[' in text else 'ValueError'}>"]
