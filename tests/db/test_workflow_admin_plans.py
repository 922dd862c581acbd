"""The workflow admin at 100,000 nodes: the run's page and the list make the same few
queries as for a small run, each through an index (EXPLAIN), never a scan of the
jobs or edges table, and the page stays bounded in what it draws.

The big run is written with plain SQL (generate_series), not the writer: 100 layers
of 1,000 nodes, each node after the first layer waiting for two of the layer before.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.admin.workflow_graph import EDGE_LIMIT, HEAD, PER_LAYER, TAIL
from django_pgjobs.admin.workflows import PROGRESS_CAP
from django_pgjobs.db import workflows as workflow_db
from django_pgjobs.db.tables import DEPENDENCY, JOB, WORKFLOW
from django_pgjobs.workflows.runs import graph_sample
from tests import workflow_jobs as w

pytestmark = [pytest.mark.django_db, pytest.mark.scale]

WIDTH, DEPTH = 1_000, 100


def big_run(width: int = WIDTH, depth: int = DEPTH) -> int:
    """A layered run of width x depth nodes: the first 30% completed, a few dead, the
    rest blocked (pending in the layer after the completed ones)."""
    n = width * depth
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {WORKFLOW} (name, kind, created_at) VALUES ('big', 'workflow', now())"
            " RETURNING id"
        )
        run_id = cursor.fetchone()[0]
        cursor.execute(f"SELECT COALESCE(max(id), 0) + 1 FROM {JOB}")
        base = cursor.fetchone()[0]
        done = n * 3 // 10
        cursor.execute(
            f"INSERT INTO {JOB} (id, task, queue, status, workflow_id, waiting, finished_at)"
            " SELECT %(base)s + g, %(task)s, 'big',"
            "        CASE WHEN g < %(done)s AND g %% 997 = 5 THEN 'dead'"
            "             WHEN g < %(done)s THEN 'completed'"
            "             WHEN g < %(done)s + %(width)s THEN 'pending' ELSE 'blocked' END,"
            "        %(run)s, CASE WHEN g < %(width)s THEN 0 ELSE 2 END,"
            "        CASE WHEN g < %(done)s THEN now() END"
            "   FROM generate_series(0, %(n)s - 1) g",
            {
                "base": base,
                "task": w.double.name,
                "done": done,
                "width": width,
                "run": run_id,
                "n": n,
            },
        )
        cursor.execute(
            f"INSERT INTO {DEPENDENCY} (child_id, position, parent_id, on_parent_failure, receives)"
            " SELECT %(base)s + g, p, %(base)s + (g / %(width)s - 1) * %(width)s"
            "        + (g %% %(width)s + p) %% %(width)s, 'run', 'none'"
            "   FROM generate_series(%(width)s, %(n)s - 1) g, generate_series(0, 1) p",
            {"base": base, "width": width, "n": n},
        )
        cursor.execute(f"SELECT setval(pg_get_serial_sequence('{JOB}', 'id'), %s)", [base + n])
        cursor.execute(f"ANALYZE {JOB}")
        cursor.execute(f"ANALYZE {DEPENDENCY}")
    return run_id


def many_runs(count: int = 2_000, size: int = 5) -> None:
    """``count`` small runs of ``size`` nodes: a table of many runs, as in production
    (the planner's estimate of one run's share comes from how many runs there are)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH runs AS (INSERT INTO {WORKFLOW} (name, kind, created_at)"
            "  SELECT 'small', 'group', now() FROM generate_series(1, %(count)s) RETURNING id)"
            f" INSERT INTO {JOB} (task, queue, status, workflow_id, waiting, finished_at)"
            " SELECT %(task)s, 'small', 'completed', runs.id, 0, now()"
            "   FROM runs, generate_series(1, %(size)s)",
            {"count": count, "size": size, "task": w.double.name},
        )


def queries_of(client: Client, url: str) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in captured.captured_queries]


def test_pages_of_a_100000_node_run_make_the_queries_of_a_small_one(
    admin_client: Client,
) -> None:
    small, big = big_run(width=3, depth=2), big_run()
    page = "admin:django_pgjobs_workflow_change"
    admin_client.get(reverse(page, args=[small]))  # warm the session
    _, small_queries = queries_of(admin_client, reverse(page, args=[small]))
    start = time.perf_counter()
    text, big_queries = queries_of(admin_client, reverse(page, args=[big]))
    print(f"100,000-node run page: {(time.perf_counter() - start) * 1000:.0f} ms")
    assert len(big_queries) == len(small_queries) <= 10, big_queries
    assert "100000 / 100000" not in text and f'data-total="{WIDTH * DEPTH}"' in text
    svg = text[text.index('<svg id="pgjobs-graph"') :]
    svg = svg[: svg.index("</svg>")]
    drawn = len(re.findall(r'class="pgjobs-node"', svg))
    columns = -(-HEAD // WIDTH) + -(-TAIL // WIDTH) + 1
    assert drawn <= columns * PER_LAYER, drawn
    assert svg.count('class="pgjobs-gap"') == 1
    assert 'data-nodes="98500"' in svg, "the nodes not read, counted by status"
    assert len(svg) < 500_000, len(svg)
    _, list_queries = queries_of(admin_client, reverse("admin:django_pgjobs_workflow_changelist"))
    assert sum(JOB in q for q in list_queries) == 1, list_queries


def plan(statement: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement, params)
        return "\n".join(r[0] for r in cursor.fetchall())


def statements(run_id: int, some: list[int]) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "WF_STATUS_COUNTS": (workflow_db.WF_STATUS_COUNTS, {"id": run_id}),
        "WF_FAILED_ROOTS": (workflow_db.WF_FAILED_ROOTS, {"id": run_id}),
        "WF_LIST_PROGRESS": (
            workflow_db.WF_LIST_PROGRESS,
            {"ids": [run_id, run_id + 1], "cap": PROGRESS_CAP + 1},
        ),
        "WF_GRAPH_NODES": (workflow_db.WF_GRAPH_NODES, {"id": run_id, "head": HEAD, "tail": TAIL}),
        "WF_GRAPH_EDGES": (workflow_db.WF_GRAPH_EDGES, {"ids": some, "limit": EDGE_LIMIT}),
        "WF_EDGES": (workflow_db.WF_EDGES, {"id": run_id, "limit": 500}),
    }


def assert_by_index(name: str, text: str, *, own_index: bool = True) -> None:
    for table in (JOB, DEPENDENCY):
        assert not re.search(rf"Seq Scan on {table}\b", text), f"{name}:\n{text}"
    if name in ("WF_GRAPH_EDGES", "WF_EDGES"):  # one probe of the edges' key per node
        assert f"{DEPENDENCY}_pkey" in text, f"{name}:\n{text}"
    if name != "WF_GRAPH_EDGES":  # the run's nodes: its own index, or any index and a LIMIT
        wanted = "pgjobs_job_workflow_idx" if own_index else "Index"
        assert wanted in text, f"{name}:\n{text}"


def test_the_admin_statements_read_a_run_through_its_index_beside_100000_nodes() -> None:
    """Every statement of the admin reads a small run through the workflow index,
    never the 100,000 nodes of the other run; on the big run itself, the bounded ones
    (LIMIT) use an index and stop at their limit. (Counting the big run's statuses reads the big run: that is its
    answer; at this size it is the whole table, which the planner may scan.)"""
    many_runs()
    big, small = big_run(), big_run(width=5, depth=4)
    with connection.cursor() as cursor:
        # The planner knows the tables, and an index probe costs more than by default
        # (as on a server with autovacuum and slow disks): so the bounded statements'
        # plans hold by their shape, not by the costs of the day. (WF_EDGES once
        # hashed all 200,000 edges for the big run's 500 nodes on PostgreSQL 16.)
        for table in (JOB, DEPENDENCY, WORKFLOW):
            cursor.execute(f"ANALYZE {table}")
        cursor.execute("SET LOCAL random_page_cost = 8")
        cursor.execute(f"SELECT id FROM {JOB} WHERE workflow_id = %s ORDER BY id", [small])
        small_ids = [r[0] for r in cursor.fetchall()]
    # the nodes the page draws: the first HEAD and the last TAIL
    big_ids = [n[0] for n in graph_sample(big, head=HEAD, tail=TAIL, edge_limit=1).nodes]
    assert len(big_ids) == HEAD + TAIL
    for name, (statement, params) in statements(small, small_ids).items():
        assert_by_index(name, plan(statement, params))
    bounded = ("WF_LIST_PROGRESS", "WF_GRAPH_NODES", "WF_GRAPH_EDGES", "WF_EDGES")
    for name, (statement, params) in statements(big, big_ids).items():
        if name in bounded:  # the run is 90% of the table: any index, stopped by LIMIT
            text = plan(statement, params)
            assert_by_index(name, text, own_index=False)
            assert "Limit" in text, f"{name}:\n{text}"
