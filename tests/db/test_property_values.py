"""Property test: arbitrary JSON-ish values, huge numbers and deep nesting
through enqueue (Python and ``pgjobs_enqueue``) -> claim -> run -> complete -> admin.

Every example ends in a clear outcome: refused at enqueue with a clear error and
nothing written, or a job that is completed (its value round-tripped) or dead with a
clear error; the worker exits normally (no thread died, nothing hangs) and the
admin list and detail pages answer 200.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.urls import reverse
from hypothesis import example, given
from hypothesis import strategies as st

from django_pgjobs.models import Job, JobResult
from tests.helpers.hostile_values import PROPERTY_SETTINGS, json_values, run_worker_burst
from tests.testapp.jobs import echo_value

pytestmark = pytest.mark.django_db(transaction=True)

CLEAR_ERRORS = (TypeError, ValueError)


def _nest(depth: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


deep = st.builds(
    _nest, st.sampled_from([10, 150, 198, 199, 200, 201, 400]), st.sampled_from(["list", "dict"])
)
values = st.one_of(json_values, json_values, deep)

# JSON texts only SQL can send (Python's encoder cannot write them).
raw_sql_texts = st.sampled_from(
    [
        "[1e5000]",
        "[-1e400]",
        "[1e-400]",
        "[" + "9" * 5000 + "]",
        "[1.5e308]",
        "[" * 199 + "]" * 199,
        "[" * 202 + "]" * 202,
        "[" * 1000 + "]" * 1000,
        '["\\u0000"]',
        '["a\\u001b[2Jb"]',
        '[{"": {"": []}}]',
    ]
)


def _check_outcome(job_id: int, value: Any | None, client: Client) -> None:
    worker = run_worker_burst()
    row = Job.objects.get(id=job_id)
    assert row.status in ("completed", "dead"), (row.status, row.attempts, row.last_error)
    assert worker.counts["fenced"] == 0
    if row.status == "dead":
        assert row.last_error and ":" in row.last_error, row.last_error  # "Type: message"
        assert len(row.errors) >= 1
    elif value is not None:
        stored = JobResult.objects.get(job_id=job_id).value
        assert stored == {"args": [value], "kwargs": {}}
    assert client.get(reverse("admin:django_pgjobs_job_changelist")).status_code == 200
    detail = client.get(reverse("admin:django_pgjobs_job_change", args=[job_id]))
    assert detail.status_code == 200


def _clean() -> None:
    Job.objects.all().delete()
    JobResult.objects.all().delete()


@PROPERTY_SETTINGS
@given(value=values)
@example(value=_nest(199, "list"))
def test_python_enqueue_to_admin(admin_user: Any, value: Any) -> None:
    _clean()
    client = Client()
    client.force_login(admin_user)
    try:
        job = echo_value.enqueue(value)
    except CLEAR_ERRORS as exc:
        assert "argument" in str(exc), exc  # names what was wrong
        assert Job.objects.count() == 0
        return
    _check_outcome(job.id, value, client)


@pytest.mark.parametrize(
    "value",
    [10**5000, [-(10**9000)], {"k": 10**4400}, _nest(3000, "dict"), _nest(5000, "list")],
    ids=["int", "in-list", "in-dict", "deep-dict", "deep-list"],
)
def test_values_hypothesis_cannot_print(admin_user: Any, value: Any) -> None:
    """Outside Hypothesis, which cannot print ints of more than 4,300 digits or
    values nested thousands deep either."""
    test_python_enqueue_to_admin.hypothesis.inner_test(admin_user, value)  # type: ignore[attr-defined]


@PROPERTY_SETTINGS
@given(text=st.one_of(raw_sql_texts, json_values.map(lambda v: json.dumps([v]))))
@example(text="[1e5000]")
def test_sql_enqueue_to_admin(admin_user: Any, text: str) -> None:
    _clean()
    client = Client()
    client.force_login(admin_user)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pgjobs_enqueue('tests.testapp.jobs.echo_value', %s::jsonb, "
                "run_at => now())",
                [text],
            )
            (job_id,) = cursor.fetchone()
    except DatabaseError as exc:
        # Refused by the function (or by jsonb itself: NaN, \u0000): a clear error.
        assert "pgjobs_enqueue" in str(exc) or "json" in str(exc).lower(), exc
        assert Job.objects.count() == 0
        return
    _check_outcome(job_id, None, client)
