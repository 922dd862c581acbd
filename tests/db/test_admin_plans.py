"""Every job admin page on a large table: a bounded number of queries, each read through
an index (EXPLAIN: never a sequential scan of the jobs table), and the window of a
task or queue condition (pages whose cost does not grow with the history).

The table is written with plain SQL (generate_series): 200,000 jobs whose statuses,
tasks and queues are interleaved over the ids (so no plan finds its rows first by
luck of the insertion order), then ANALYZE. The search window is set to a tenth of the
table, as the shipped 100,000 is of the 1,000,000-row benchmark (bench/admin_pages.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.admin import job_list
from django_pgjobs.db.tables import JOB, QUEUE
from django_pgjobs.maintenance.rollup import Rollup
from tests.helpers.admin_rows import OVERVIEW, changelist_url, text
from tests.testapp.jobs import add, discard_me, noop, send_email

pytestmark = pytest.mark.django_db

ROWS = 200_000
#: The most rows of the jobs table one statement may read (EXPLAIN ANALYZE: rows
#: returned plus rows removed by a filter, over every scan of the table): a quarter of
#: it. The window is a tenth; the due list is all 10,000 pending jobs.
MOST_ROWS_READ = ROWS // 4
#: The most queries any job admin page makes: the overview's 10 (session, user, 8 of
#: its own); a list's session, user, the row estimate, the queue choices, the search's
#: probes, the window, the count and the page.
MOST_QUERIES = 10

FILL = f"""
INSERT INTO {JOB} (task, queue, status, run_at, created_at, started_at, finished_at,
                   heartbeat_at, attempts, lease, worker, args, last_error)
SELECT 'tests.testapp.jobs.' || (ARRAY['noop', 'add', 'send_email', 'always_fails'])[1 + g % 4],
       (ARRAY['default', 'emails', 'reports', 'other'])[1 + (g / 7) % 4],
       s.status, t, t, t, CASE WHEN s.status IN ('completed', 'dead', 'cancelled') THEN t END,
       CASE WHEN s.status = 'running' THEN now() - interval '10 minutes' END,
       CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN s.status = 'running' THEN 'gone-worker' END,
       jsonb_build_array(g), CASE WHEN s.status = 'dead' THEN 'boom' END
  FROM generate_series(1, %(n)s) AS g,
       LATERAL (SELECT now() - interval '1 hour' + interval '1 hour' * g / %(n)s AS t,
                       CASE WHEN g % 100 < 5 THEN 'pending'
                            WHEN g % 100 = 5 THEN 'dead'
                            WHEN g % 1000 = 6 THEN 'cancelled'
                            WHEN g % 1000 = 7 THEN 'running'
                            ELSE 'completed' END AS status) AS s
"""


@pytest.fixture
def big_table(monkeypatch: pytest.MonkeyPatch) -> int:
    """Fill and analyze the table; return a dead job's id."""
    monkeypatch.setattr(job_list, "SEARCH_WINDOW", ROWS // 10)
    with connection.cursor() as cursor:
        cursor.execute(FILL.replace("%", "%%").replace("%%(n)s", "%(n)s"), {"n": ROWS})
        cursor.execute(
            f"INSERT INTO {QUEUE} (name, paused, updated_at) VALUES ('emails', false, now())"
        )
        cursor.execute(f"ANALYZE {JOB}")
        cursor.execute(f"SELECT max(id) FROM {JOB} WHERE status = 'dead'")
        dead = int(cursor.fetchone()[0])
    # The minute rollup catches up, as the workers' maintenance loop does: the overview
    # then reads minutes, not the hour's 190,000 finished jobs.
    for _ in range(100):
        if Rollup(time_budget=None).run_once()["caught_up"]:
            break
    return dead


def pages(job: int) -> dict[str, str]:
    return {
        "list": changelist_url(),
        "page 3": changelist_url(p="3"),
        "status dead": changelist_url(status__exact="dead"),
        "status pending": changelist_url(status__exact="pending"),
        "status running": changelist_url(status__exact="running"),
        "status completed": changelist_url(status__exact="completed"),
        "status cancelled": changelist_url(status__exact="cancelled"),
        "stuck": changelist_url(attention="stuck"),
        "dead-lettered": changelist_url(attention="dead"),
        "due": changelist_url(attention="due"),
        "unknown to workers": changelist_url(attention="unknown"),
        "queue": changelist_url(queue="emails"),
        "task": changelist_url(task=send_email.name),
        "task with no rows": changelist_url(task=discard_me.name),
        "dead of a task": changelist_url(attention="dead", task=add.name),
        "search, not a task": changelist_url(q="noop"),
        "search, a task": changelist_url(q=noop.name),
        "search, a task with no rows": changelist_url(q=discard_me.name),
        "search, a task with no rows, older": changelist_url(q=discard_me.name, id__lt="150000"),
        "search, an id": changelist_url(q=str(job)),
        "search, a key": changelist_url(q="no-such-key"),
        "job page": reverse("admin:django_pgjobs_job_change", args=[job]),
        "overview": reverse(OVERVIEW),
        # a queue's page: its busiest fair keys (tests/db/test_fair_admin.py)
        "queue page": reverse("admin:django_pgjobs_queue_change", args=["emails"]),
    }


def explain(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql.replace("%", "%%"))
        return "\n".join(r[0] for r in cursor.fetchall())


def rows_read(sql: str) -> int:
    """Rows of the jobs table the statement read (it runs: every statement is a SELECT)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.replace("%", "%%"))
        value = cursor.fetchone()[0]
    plan = json.loads(value) if isinstance(value, str) else value

    def walk(node: dict[str, Any]) -> int:
        own = 0
        if node.get("Relation Name") == JOB:
            own = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node[
                "Actual Loops"
            ]
        return own + sum(walk(child) for child in node.get("Plans", []))

    return walk(plan[0]["Plan"])


def scans_the_table(plan: str) -> bool:
    """A sequential scan of the jobs table that is not bounded by a Limit.

    Two are bounded, and allowed: the unfiltered list's count (``SELECT count(*) FROM
    (SELECT id FROM jobs LIMIT 10001)``) reads 10,001 rows in the table's order whatever
    its size; and a count of a status that most rows have (completed), where the
    planner expects at least half the table to match, stops after about twice its
    limit. Any other filtered scan may read the whole table to find its rows."""
    lines = plan.splitlines()
    for i, line in enumerate(lines):
        if not re.search(rf"Seq Scan on {JOB}\b", line):
            continue
        depth = len(line) - len(line.lstrip())
        details = []
        for below in lines[i + 1 :]:
            if len(below) - len(below.lstrip()) <= depth or "->" in below:
                break
            details.append(below)
        if not (i and "Limit" in lines[i - 1]):
            return True
        expected = int(re.search(r"rows=(\d+)", line).group(1))  # type: ignore[union-attr]
        if any("Filter:" in d for d in details) and expected < ROWS // 2:
            return True
    return False


@pytest.mark.scale
def test_every_page_reads_the_jobs_through_an_index_in_a_few_queries(
    admin_client: Client, big_table: int
) -> None:
    admin_client.get(changelist_url())  # warm the session
    scans, reads = [], []
    for name, url in pages(big_table).items():
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(url)
        assert response.status_code == 200, (name, url, response.status_code)
        queries = [q["sql"] for q in captured.captured_queries]
        assert len(queries) <= MOST_QUERIES, (name, queries)
        on_jobs = [q for q in queries if re.search(rf"\b{JOB}\b", q)]
        assert on_jobs, name
        for sql in on_jobs:
            if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            plan = explain(sql)
            if scans_the_table(plan):
                scans.append(f"{name}: {sql}\n{plan}")
            if (read := rows_read(sql)) > MOST_ROWS_READ:
                reads.append(f"{name}: {read} rows: {sql}\n{plan}")
    assert not scans, "\n\n".join(scans)
    assert not reads, "\n\n".join(reads)


@pytest.mark.scale
def test_a_task_condition_reads_the_window_through_the_primary_key(
    admin_client: Client, big_table: int
) -> None:
    """A task with no rows among 200,000: the count reads the window's 20,000 rows by
    the primary key's range (having counted none, the page reads nothing more), and
    the page says where it stopped."""
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(changelist_url(q=discard_me.name))
    assert "0 jobs" in text(response)
    assert "looks through the newest 20,000 jobs of this list only" in text(response)
    window = [q["sql"] for q in captured.captured_queries if '."task" = ' in q["sql"]]
    assert len(window) == 1, window  # the count
    for sql in window:
        plan = explain(sql)
        # an index scan of the primary key's range, or a bitmap of it (the embedded
        # server's planner chose that): either way the window, not the table
        assert re.search(rf"(Index Scan using|Bitmap Index Scan on) {JOB}_pkey", plan) or (
            "Index Scan Backward" in plan
        ), plan
        assert re.search(r"Index Cond: \(id >= \d+\)", plan), plan


def test_rows_render_as_django_renders_them(admin_client: Client) -> None:
    """The checkbox and the row links, written without Django's widget templates and
    per-row reverse()/resolve(), are the HTML Django's own code makes."""
    from django.contrib import admin as django_admin
    from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
    from django.contrib.admin.views.main import ChangeList

    job = add.enqueue(1, 2)
    model_admin = django_admin.site._registry[type(job)]
    assert model_admin.action_checkbox(job) == django_admin.ModelAdmin.action_checkbox(
        model_admin, job
    )
    response = admin_client.get(changelist_url(status__exact="pending", q=add.name))
    cl = response.context["cl"]
    assert cl.preserved_filters == ""  # carried by url_for_result instead
    django_url = add_preserved_filters(
        {
            "preserved_filters": model_admin.get_preserved_filters(response.wsgi_request),
            "opts": cl.opts,
        },
        ChangeList.url_for_result(cl, job),
    )
    assert cl.url_for_result(job) == django_url
    assert f'href="{django_url}"'.replace("&", "&amp;") in response.content.decode()
