"""The admin's list, filters, search, detail page, overview and permissions (test client).

Filters and the overview are checked against jobs made through the real code
paths; query counts are compared between a small and a larger table to show they
do not grow with the number of rows.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.models import Job, KnownTask, Worker
from tests.helpers.admin_rows import (
    OVERVIEW,
    REAP,
    cancelled,
    changelist_url,
    completed,
    dead,
    keep_fresh,
    listed_ids,
    pending,
    post_action,
    running,
    text,
    wait_stuck,
)
from tests.testapp.jobs import add, noop, send_email

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def every_state() -> dict[str, Job]:
    """One job in every state (and a stuck one) across two queues."""
    jobs = {
        "completed": completed("default"),
        "dead": dead("emails", message="smtp refused\nsecond line"),
        "cancelled": cancelled("default"),
        "stuck": running("reports"),
    }
    wait_stuck(jobs["stuck"])
    jobs["running"] = running("emails")
    jobs["future"] = pending("default", delay=3600)
    jobs["due"] = pending("emails")
    return jobs


def test_filters_return_exactly_the_right_rows(
    admin_client: Client, every_state: dict[str, Job]
) -> None:
    j = every_state
    keep_fresh(j["running"])
    assert listed_ids(admin_client, changelist_url()) == sorted(
        (job.id for job in j.values()), reverse=True
    ), "unfiltered: every job, newest first"
    cases: dict[str, set[str]] = {
        "attention=stuck": {"stuck"},
        "attention=dead": {"dead"},
        "attention=due": {"due"},
        "status__exact=pending": {"future", "due"},
        "status__exact=running": {"stuck", "running"},
        "status__exact=completed": {"completed"},
        "status__exact=cancelled": {"cancelled"},
        "queue=emails": {"dead", "running", "due"},
        "queue=reports": {"stuck"},
        f"task={send_email.name}": set(),
        "queue=emails&status__exact=dead": {"dead"},
    }
    for query, names in cases.items():
        keep_fresh(j["running"])
        ids = listed_ids(admin_client, changelist_url() + "?" + query)
        assert ids == sorted((j[n].id for n in names), reverse=True), query
    task_ids = listed_ids(admin_client, changelist_url(task=add.name))
    assert set(task_ids) == {
        j[n].id for n in ("completed", "cancelled", "stuck", "running", "future", "due")
    }


def test_list_shows_status_attempts_heartbeat_worker_and_first_error_line(
    admin_client: Client, every_state: dict[str, Job]
) -> None:
    keep_fresh(every_state["running"])
    response = admin_client.get(changelist_url())
    html = response.content.decode()
    for css in (
        "pgjobs-dead",
        "pgjobs-completed",
        "pgjobs-cancelled",
        "pgjobs-pending",
        "pgjobs-running",
        "pgjobs-stuck",
    ):
        assert f'class="pgjobs-status {css}"' in html, css
    body = text(response)
    assert "builtins.ValueError: smtp refused" in body
    assert "second line" not in body, "only the first line of the last error is listed"
    assert "1 / 1" in body and "admin-test-worker" in body
    assert "running · stuck" in body
    assert 'class="pgjobs-stale"' in html, "a stale heartbeat age is highlighted"
    # Queue and task filter choices come from the registry and the pending rows.
    filter_html = html[html.index('id="changelist-filter"') :]
    for queue in ("default", "emails"):
        assert f"?queue={queue}" in filter_html
    assert f"?task={noop.name}" in filter_html, "registered tasks are offered even with no rows"


def test_search_by_id_task_and_idempotency_key(admin_client: Client) -> None:
    a = add.using(idempotency_key="order-42").enqueue(1, 1)
    b = noop.enqueue()
    c = add.enqueue(5, 5)
    assert listed_ids(admin_client, changelist_url(q=str(b.id))) == [b.id]
    assert listed_ids(admin_client, changelist_url(q=f"%23{c.id}")) == [c.id]
    assert listed_ids(admin_client, changelist_url(q="order-42")) == [a.id]
    assert listed_ids(admin_client, changelist_url(q=noop.name)) == [b.id]
    assert listed_ids(admin_client, changelist_url(q=add.name)) == [c.id, a.id]
    assert listed_ids(admin_client, changelist_url(q="nothing-like-this")) == []


def test_search_for_a_task_nobody_knows_reads_no_job(admin_client: Client) -> None:
    with connection.cursor() as cur:  # rows of a task this release no longer has
        cur.execute(
            "INSERT INTO django_pgjobs_job (task, status, finished_at) VALUES"
            " ('gone.task', 'dead', now()) RETURNING id"
        )
        gone = cur.fetchone()[0]
    with CaptureQueriesContext(connection) as captured:
        assert listed_ids(admin_client, changelist_url(q="gone.task")) == []
    assert not [
        q for q in captured.captured_queries if "gone.task" in q["sql"] and '"task"' in q["sql"]
    ]
    # Once a worker knows the name (it registered it), the search looks for it.
    KnownTask.objects.create(name="gone.task")
    assert listed_ids(admin_client, changelist_url(q="gone.task")) == [gone]


def test_task_and_queue_conditions_look_through_the_newest_jobs_of_the_list(
    admin_client: Client, monkeypatch: Any
) -> None:
    """Neither column has an index over finished jobs: a task or queue filter or a task
    search reads the newest SEARCH_WINDOW jobs of the list, says so, and links to the
    window before; a narrower list is its own window; an id is found however old."""
    import django_pgjobs.admin.job_list as job_admin

    monkeypatch.setattr(job_admin, "SEARCH_WINDOW", 5)
    failed = dead("reports")  # the oldest job, and the only dead one
    old = add.using(queue="reports").enqueue(1, 1)
    noop.enqueue_many([() for _ in range(6)])  # the newest 6: no add job among them
    for url in (
        changelist_url(q=add.name),
        changelist_url(task=add.name),
        changelist_url(queue="reports"),
    ):
        response = admin_client.get(url)
        assert [j.id for j in response.context["cl"].result_list] == [], url
        assert "looks through the newest 5 jobs of this list only" in text(response), url
        older = (
            reverse("admin:django_pgjobs_job_changelist") + response.context["cl"].older_window_url
        )
        assert "id__lt=" in older
        assert listed_ids(admin_client, older) == (
            [old.id, failed.id] if "queue=" in url else [old.id]
        ), older
    # The dead-lettered list holds one job: it is the whole window, nothing is left out.
    response = admin_client.get(changelist_url(attention="dead", task=failed.task))
    assert [j.id for j in response.context["cl"].result_list] == [failed.id]
    assert "looks through the newest" not in text(response)
    assert listed_ids(admin_client, changelist_url(q=str(failed.id))) == [failed.id]
    # Unfiltered lists and lists without a task or queue condition have no window.
    assert "looks through the newest" not in text(admin_client.get(changelist_url()))


def test_detail_is_read_only_with_pretty_args_tracebacks_and_result(admin_client: Client) -> None:
    failed = dead(message="card declined")
    done = send_email.using(queue="emails").enqueue("ann@example.com", subject="hello")
    from django_pgjobs.testing import run_jobs

    run_jobs(queues=["emails"])
    url = reverse("admin:django_pgjobs_job_change", args=[failed.id])
    response = admin_client.get(url)
    assert response.status_code == 200
    body = text(response)
    assert "Traceback (most recent call last)" in body
    assert "ValueError: card declined" in body
    assert "attempt 1" in body
    assert "Suspect" in body and "runs alone in a child process" in body
    assert 'name="_save"' not in response.content.decode(), "no save button: read-only"
    done_page = admin_client.get(reverse("admin:django_pgjobs_job_change", args=[done.id]))
    assert "&quot;to&quot;: &quot;ann@example.com&quot;" in done_page.content.decode(), (
        "result pretty-printed"
    )
    assert "&quot;subject&quot;: &quot;hello&quot;" in done_page.content.decode()
    # Posting the form changes nothing and is refused.
    before = Job.objects.get(id=failed.id)
    refused = admin_client.post(url, {"task": "x", "status": "pending", "attempts": "0"})
    assert refused.status_code == 403
    after = Job.objects.get(id=failed.id)
    assert (after.task, after.status, after.lease) == (before.task, before.status, before.lease)


def test_nobody_can_add_or_delete_jobs(admin_client: Client) -> None:
    job = pending()
    assert admin_client.get(reverse("admin:django_pgjobs_job_add")).status_code == 403
    assert (
        admin_client.post(reverse("admin:django_pgjobs_job_add"), {"task": add.name}).status_code
        == 403
    )
    assert (
        admin_client.post(
            reverse("admin:django_pgjobs_job_delete", args=[job.id]), {"post": "yes"}
        ).status_code
        == 403
    )
    response = post_action(admin_client, "delete_selected", [job.id])
    assert Job.objects.filter(id=job.id).exists()
    assert "delete_selected" not in response.content.decode()


def _staff(django_user_model: Any, *codenames: str) -> Client:
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_pgjobs", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def test_view_only_user_sees_no_actions_and_cannot_run_them(django_user_model: Any) -> None:
    client = _staff(django_user_model, "view_job", "view_worker")
    failed = dead()
    response = client.get(changelist_url())
    assert response.status_code == 200
    assert response.context["action_form"] is None, "no actions without change permission"
    assert "Reap stuck now" not in response.content.decode()
    post_action(client, "retry_now", [failed.id])
    assert Job.objects.get(id=failed.id).status == "dead"
    assert client.post(reverse(REAP)).status_code == 403
    assert client.get(reverse(OVERVIEW)).status_code == 200


def test_user_with_change_permission_gets_the_actions(django_user_model: Any) -> None:
    client = _staff(django_user_model, "view_job", "change_job")
    failed = dead()
    response = client.get(changelist_url())
    choices = [value for value, _ in response.context["action_form"].fields["action"].choices]
    assert choices == ["", "retry_now", "cancel_jobs", "wake_now", "send_signal_action"]
    post_action(client, "retry_now", [failed.id])
    assert Job.objects.get(id=failed.id).status == "pending"


def test_user_without_view_permission_sees_nothing(django_user_model: Any) -> None:
    client = _staff(django_user_model)
    assert client.get(changelist_url()).status_code == 403
    assert client.get(reverse(OVERVIEW)).status_code == 403


def test_overview_numbers(admin_client: Client, every_state: dict[str, Job]) -> None:
    keep_fresh(every_state["running"])
    Worker.objects.create(id="host-a:1:abc", host="host-a", pid=1, queues=["emails"], concurrency=4)
    response = admin_client.get(reverse(OVERVIEW))
    assert response.status_code == 200
    ov = response.context["ov"]
    rows = {q.queue: q for q in ov.queues}
    assert (rows["emails"].pending, rows["emails"].due, rows["emails"].running) == (1, 1, 1)
    assert rows["emails"].lag is not None and rows["emails"].lag.total_seconds() >= 0
    assert (rows["default"].pending, rows["default"].due) == (1, 0)
    assert rows["default"].lag is None, "a job scheduled for later is not lag"
    assert (rows["reports"].running, rows["reports"].stuck) == (1, 1)
    assert rows["default"].finished == {"completed": 1, "cancelled": 1}
    assert rows["emails"].finished == {"dead": 1}
    assert (ov.stuck, ov.dead_recent, ov.completed_5m, ov.completed_60m) == (1, 1, 1, 1)
    assert [w.id for w in ov.live_workers] == ["host-a:1:abc"]
    assert ov.health.total_bytes > 0
    body = text(response)
    assert "host-a:1:abc" in body and "dead-lettered, last 24 h" in body


def test_app_index_links_to_the_overview(admin_client: Client) -> None:
    response = admin_client.get(reverse("admin:app_list", args=["django_pgjobs"]))
    assert reverse(OVERVIEW) in response.content.decode()


def test_worker_list_is_read_only(admin_client: Client) -> None:
    Worker.objects.create(id="host-b:2:def", host="host-b", pid=2, queues=[], concurrency=8)
    response = admin_client.get(reverse("admin:django_pgjobs_worker_changelist"))
    assert response.status_code == 200 and "host-b:2:def" in response.content.decode()
    assert admin_client.get(reverse("admin:django_pgjobs_worker_add")).status_code == 403
    change = reverse("admin:django_pgjobs_worker_change", args=["host-b:2:def"])
    assert admin_client.post(change, {"pid": "3"}).status_code == 403
    assert Worker.objects.get(id="host-b:2:def").pid == 2


def _queries(client: Client, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return [q["sql"] for q in ctx.captured_queries]


def test_query_counts_stay_flat_as_rows_grow(admin_client: Client) -> None:
    dead()
    pending("emails")
    urls = [
        changelist_url(),
        changelist_url(attention="dead"),
        changelist_url(queue="emails"),
        changelist_url(q="7"),
        reverse(OVERVIEW),
    ]
    small = {url: _queries(admin_client, url) for url in urls}
    add.using(queue="bulk").enqueue_many([(i, i) for i in range(400)])
    noop.using(queue="emails").enqueue_many([() for _ in range(150)])
    large = {url: _queries(admin_client, url) for url in urls}
    for url in urls:
        assert len(large[url]) == len(small[url]), (url, small[url], large[url])
    for url in urls:
        for statement in large[url]:
            assert "COUNT(*) AS" not in statement or "LIMIT" in statement, (
                f"an unbounded count on {url}: {statement}"
            )


def test_list_counts_are_capped_not_full(admin_client: Client, monkeypatch: Any) -> None:
    import django_pgjobs.admin.job_list as job_admin

    monkeypatch.setattr(job_admin, "COUNT_CAP", 5)
    add.enqueue_many([(i, i) for i in range(8)])
    response = admin_client.get(changelist_url())
    assert "more than 5 jobs" in text(response)
    assert len(response.context["cl"].result_list) == 8
    response = admin_client.get(changelist_url(status__exact="dead"))
    assert "0 jobs" in text(response)


def test_every_page_renders_under_use_tz_false(
    admin_client: Client, every_state: dict[str, Job]
) -> None:
    """A project with ``USE_TZ = False`` gets naive times from the ORM; the changelist's
    "run at" column called ``localtime()`` on them and the page was a 500."""
    base = reverse("admin:django_pgjobs_job_changelist")
    pages = [
        base,
        f"{base}?status__exact=dead",
        f"{base}?q=noop",
        reverse("admin:django_pgjobs_job_overview"),
        reverse("admin:django_pgjobs_worker_changelist"),
        *(reverse("admin:django_pgjobs_job_change", args=[j.id]) for j in every_state.values()),
    ]
    with override_settings(USE_TZ=False):
        connection.close()  # a new connection, loading naive times
        try:
            statuses = {url: admin_client.get(url).status_code for url in pages}
        finally:
            connection.close()
    assert statuses == dict.fromkeys(pages, 200)
