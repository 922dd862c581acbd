"""The admin against hostile values: odd search terms and ids,
huge and undecodable rows. Every page answers; big columns are never loaded whole."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.models import Job
from tests.helpers.admin_rows import changelist_url, listed_ids, messages_of, post_action
from tests.testapp.jobs import add

pytestmark = pytest.mark.django_db


def _detail(job_id: int | str) -> str:
    return reverse("admin:django_pgjobs_job_change", args=[job_id])


@pytest.mark.parametrize("term", ["²", "#²", "٣", "99999999999999999999", "#" + "9" * 40])
def test_search_for_odd_numbers_answers(admin_client: Client, term: str) -> None:
    add.enqueue(1, 2)
    url = changelist_url(q=quote(term))
    assert admin_client.get(url).status_code == 200
    assert listed_ids(admin_client, url) == []


def test_actions_on_ticked_ids_out_of_range_answer(admin_client: Client) -> None:
    job = add.enqueue(1, 2)
    response = post_action(admin_client, "cancel_jobs", [job.id, 2**63, 10**30, "²"])  # type: ignore[list-item]
    assert response.status_code == 200
    assert messages_of(response) == ["Cancelled 1 job."]


@pytest.mark.parametrize("job_id", ["99999999999999999999", "²", "0"])
def test_detail_of_an_impossible_id_is_a_missing_job(admin_client: Client, job_id: str) -> None:
    response = admin_client.get(_detail(job_id))
    assert response.status_code in (302, 404)


def _hostile(args_sql: str, **columns: str) -> Job:
    job = add.enqueue(1, 2)
    sets = ", ".join([f"args = {args_sql}", *(f"{k} = {v}" for k, v in columns.items())])
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE django_pgjobs_job SET {sets} WHERE id = %s", [job.id])
    return job


def test_the_list_never_loads_arguments_errors_or_whole_last_errors(admin_client: Client) -> None:
    _hostile("jsonb_build_array(repeat('x', 300000))", last_error="'boom' || repeat('y', 300000)")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(changelist_url())
    assert response.status_code == 200
    page = [q["sql"] for q in queries if q["sql"].startswith('SELECT "django_pgjobs_job"."id"')]
    assert len(page) == 1, [q["sql"] for q in queries]
    loaded = page[0][: page[0].index(" FROM ")]
    assert '"task"' in loaded
    for column in ("args", "kwargs", "errors", "last_error"):
        assert f'"django_pgjobs_job"."{column}"' not in loaded.replace(
            'LEFT("django_pgjobs_job"."last_error"', ""
        ), column
    assert len(response.content) < 100_000
    assert "boomyyyy" in response.content.decode()


def test_undecodable_rows_do_not_break_the_list_or_the_detail(admin_client: Client) -> None:
    """Rows written by psql (or before pgjobs_enqueue bounded its input)."""
    huge = _hostile("'[1e5000]'::jsonb")
    deep = _hostile("(repeat('[', 3000) || repeat(']', 3000))::jsonb")
    assert admin_client.get(changelist_url()).status_code == 200
    for job in (huge, deep):
        response = admin_client.get(_detail(job.id))
        assert response.status_code == 200, job
    assert "1000000000" in admin_client.get(_detail(huge.id)).content.decode()


def test_the_detail_page_cuts_huge_values_with_a_note(admin_client: Client) -> None:
    entries = ", ".join(
        f"jsonb_build_object('attempt', {i}, 'type', 'builtins.ValueError', 'message', 'm{i}', "
        f"'traceback', repeat('t', 1000))"
        for i in range(1, 61)
    )
    job = _hostile(
        "jsonb_build_array(repeat('x', 500000))",
        errors=f"jsonb_build_array({entries})",
        kwargs="jsonb_build_object('k', repeat('z', 100000))",
    )
    response = admin_client.get(_detail(job.id))
    assert response.status_code == 200
    html = response.content.decode()
    assert "truncated: 500,004 bytes in all" in html
    assert "truncated: 100,009 bytes in all" in html
    assert "40 older entries not shown" in html  # MAX_ERRORS_KEPT = 20 newest
    assert "m60" in html and "m41" in html and "m40<" not in html
    assert len(response.content) < 250_000


_UNDECODABLE = {
    "huge number": "'[1e5000]'::jsonb",
    "deep nesting": "(repeat('[', 3000) || repeat(']', 3000))::jsonb",
    "deep object": "(repeat('{\"a\":', 3000) || '1' || repeat('}', 3000))::jsonb",
}


@pytest.mark.parametrize("column", ["trace_context", "errors", "kwargs"])
@pytest.mark.parametrize("value", list(_UNDECODABLE.values()), ids=list(_UNDECODABLE))
def test_undecodable_values_of_every_column_do_not_break_a_page(
    admin_client: Client, column: str, value: str
) -> None:
    """A trace_context or errors holding 1e5000 or deep nesting cannot be decoded; the
    list and the detail page answer with a placeholder, not a 500."""
    job = _hostile("'[]'::jsonb", **{column: value})
    listed = admin_client.get(changelist_url())
    assert listed.status_code == 200
    assert listed_ids(admin_client, changelist_url()) == [job.id]
    response = admin_client.get(_detail(job.id))
    assert response.status_code == 200, column
    html = response.content.decode()
    if column == "errors":  # the error history says what it could not decode
        assert "&lt;undecodable: " in html
    elif column == "kwargs":  # shown as stored
        assert "1000000000" in html or "[[[[" in html or "{&quot;a&quot;: {&quot;a&quot;" in html


def test_an_undecodable_result_does_not_break_the_detail_page(admin_client: Client) -> None:
    job = _hostile("'[]'::jsonb", status="'completed'", finished_at="now()")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_pgjobs_jobresult (job_id, value, created_at) "
            "VALUES (%s, (repeat('[', 3000) || repeat(']', 3000))::jsonb, now())",
            [job.id],
        )
    assert admin_client.get(_detail(job.id)).status_code == 200


@pytest.mark.parametrize("term", ["%00", "a%00b", "%C0%80", "%FF"])
def test_a_nul_in_a_filter_or_search_answers(admin_client: Client, term: str) -> None:
    """``?queue=%00`` answers, not a 500 (PostgreSQL text cannot hold NUL)."""
    job = add.enqueue(1, 2)
    for params in ({"queue": term}, {"q": term}, {"task": term}, {"status": term}):
        response = admin_client.get(changelist_url(**params), follow=True)
        assert response.status_code == 200, params
        assert "Database error" not in response.content.decode(), params
    assert listed_ids(admin_client, changelist_url()) == [job.id]


@pytest.mark.parametrize("page", ["worker", "queue", "workflow"])
@pytest.mark.parametrize("lookup", ["q=%00", "name=%00", "id=%00", "kind__exact=%00"])
def test_a_nul_in_any_list_lookup_answers(admin_client: Client, page: str, lookup: str) -> None:
    """Every list of the package takes a NUL in a lookup as a wrong lookup, not a 500."""
    url = reverse(f"admin:django_pgjobs_{page}_changelist") + "?" + lookup
    response = admin_client.get(url, follow=True)
    assert response.status_code == 200
    assert "Database error" not in response.content.decode()
