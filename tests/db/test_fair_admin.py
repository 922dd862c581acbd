"""A fair queue's admin page shows its busiest fair keys: the ten with the most
pending jobs, most first, each linking to its pending jobs; a count reaching the cap
shows as that many or more; running and finished jobs do not count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.db.tables import JOB
from django_pgjobs.health import overview as overview_queries
from django_pgjobs.models import Queue
from tests.fair_jobs import tenant_job
from tests.helpers.admin_rows import text

pytestmark = pytest.mark.django_db

# key, jobs, status: "big" past the cap, k00..k13 with 14..1 pending jobs, the shared
# key "" with 2, and a key whose jobs all ran or run (not pending: not shown).
ROWS = [
    ("big", overview_queries.BUSIEST_COUNT_CAP + 5, "pending"),
    *[(f"k{i:02}", 14 - i, "pending") for i in range(14)],
    ("", 2, "pending"),
    ("gone", 30, "completed"),
    ("gone", 3, "running"),
]


def fill(queue: str) -> None:
    with connection.cursor() as cursor:
        for key, n, status in ROWS:
            cursor.execute(
                f"INSERT INTO {JOB} (task, queue, status, fair_key, attempts, lease,"
                "                    started_at, finished_at, heartbeat_at, worker)"
                " SELECT %(task)s, %(queue)s, %(status)s, %(key)s, s.ran, s.ran,"
                "        CASE WHEN s.ran = 1 THEN now() END,"
                "        CASE WHEN %(status)s = 'completed' THEN now() END,"
                "        CASE WHEN %(status)s = 'running' THEN now() END,"
                "        CASE WHEN %(status)s = 'running' THEN 'w' END"
                "   FROM generate_series(1, %(n)s),"
                "        LATERAL (SELECT CASE WHEN %(status)s = 'pending' THEN 0 ELSE 1 END"
                "                 AS ran) AS s",
                {"task": tenant_job.name, "queue": queue, "status": status, "key": key, "n": n},
            )


def page_url(queue: str) -> str:
    return reverse("admin:django_pgjobs_queue_change", args=[queue])


def test_the_queue_page_lists_the_ten_busiest_fair_keys_most_first(admin_client: Client) -> None:
    Queue.objects.create(name="fair")
    fill("fair")
    fill("other-fair")  # another queue's keys are not this one's
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(page_url("fair"))
    assert response.status_code == 200
    shown = response.context["pgjobs_fair_keys"]
    cap = overview_queries.BUSIEST_COUNT_CAP
    assert [(key, n, capped) for key, n, capped, _ in shown] == [
        ("big", cap, True),
        *[(f"k{i:02}", 14 - i, False) for i in range(9)],
    ]
    page = text(response)
    assert "Busiest fair keys" in page and f"big {cap}+" in page and "gone" not in page
    link = shown[1][3]
    assert link.startswith(reverse("admin:django_pgjobs_job_changelist"))
    assert "queue=fair" in link and "fair_key=k00" in link and "status__exact=pending" in link
    busiest = [q["sql"] for q in captured.captured_queries if "fair_key >= k.key" in q["sql"]]
    assert len(busiest) == 1, busiest


def test_the_shared_key_shows_without_a_link_and_a_queue_without_keys_shows_none(
    admin_client: Client,
) -> None:
    Queue.objects.create(name="fair")
    Queue.objects.create(name="plain")
    tenant_job.using(queue="fair").enqueue("a", 0)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {JOB} (task, queue, fair_key, attempts, lease)"
            " SELECT %s, 'fair', '', 0, 0 FROM generate_series(1, 3)",
            [tenant_job.name],
        )
    response = admin_client.get(page_url("fair"))
    assert [(k, n) for k, n, _, _ in response.context["pgjobs_fair_keys"]] == [
        ("", 3),
        ("tenant:a", 1),
    ]
    assert '"" (jobs without a key of their own) 3' in text(response)
    plain = admin_client.get(page_url("plain"))
    assert plain.context["pgjobs_fair_keys"] == []
    assert "Busiest fair keys" not in text(plain)


def test_the_busiest_keys_read_a_bounded_number_of_index_entries() -> None:
    """A key's count stops at the cap, and keys past the first ones in key order are
    not read: the statement's cost does not follow the backlog."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {JOB} (task, queue, fair_key, attempts, lease)"
            " SELECT %s, 'fair', 'k' || lpad(mod(g, 300)::text, 3, '0'), 0, 0"
            " FROM generate_series(1, 3000) g",
            [tenant_job.name],
        )
        cursor.execute(f"ANALYZE {JOB}")
    got = overview_queries.busiest_fair_keys(connection, "fair")
    # 300 keys of 10 jobs each: equal counts go in key order
    assert got == [(f"k{i:03}", 10) for i in range(10)]
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + overview_queries.FAIR_KEYS_BUSIEST,
            {"queue": "fair", "keys": 5, "cap": 7, "top": 10},
        )
        value = cursor.fetchone()[0]
    plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
    scans = list(job_scans(plan))
    assert scans and all(n["Index Name"] == "pgjobs_job_fair_idx" for n in scans), scans
    read = sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in scans
    )
    # 5 keys found (6 descents, the last finding none), 7 entries counted for each
    assert read <= 6 + 5 * 7, read


def job_scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if node.get("Relation Name") == JOB:
        yield node
    for child in node.get("Plans", []):
        yield from job_scans(child)
