"""The statistics pass (maintenance/statistics.py): a prepared claim planned while the
jobs table was a page keeps its sequential scan as the table grows, until the table's
statistics change; the pass changes them once the table has outgrown them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from psycopg import sql as psycopg_sql

from django_pgjobs import claim
from django_pgjobs.db.tables import JOB
from django_pgjobs.maintenance.statistics import FLOOR_PAGES, TableStatistics, stale
from tests.helpers.plans import fill_jobs, numbered_placeholders

PARAMS = {"worker": "w", "n": 10, "since": claim.UNBOUNDED, "queue": "default"}


@pytest.mark.parametrize(
    ("pages", "planned", "never", "expected"),
    [
        (0, 0, True, False),  # empty: the planner assumes 10 pages, nothing to learn
        (1, 0, True, True),  # rows, never analysed
        (FLOOR_PAGES - 1, 0, False, False),
        (FLOOR_PAGES, 0, False, True),
        (2 * FLOOR_PAGES - 1, FLOOR_PAGES, False, False),
        (2 * FLOOR_PAGES, FLOOR_PAGES, False, True),
        (FLOOR_PAGES, 2 * FLOOR_PAGES, False, False),  # shrunk: an index plan stays cheap
    ],
)
def test_stale(pages: int, planned: int, never: bool, expected: bool) -> None:
    assert stale(pages, planned, never) is expected


@pytest.fixture
def young_table() -> Iterator[Any]:
    """The jobs table as a fresh install has it (TRUNCATE, inside the test's transaction:
    never analysed), five pending jobs, and the claim prepared with a generic plan."""
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {JOB}")
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, run_at)"
            " SELECT 'live', 'default', now() - interval '1 second' FROM generate_series(1, 5)"
        )
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        numbered, names = numbered_placeholders(claim.claim_statements()["JOB_CLAIM_ONE_QUEUE"])
        cur.execute(f"PREPARE young_claim AS {numbered}")
        arguments = psycopg_sql.SQL(", ").join(psycopg_sql.Literal(PARAMS[n]) for n in names)
        explain = (
            "EXPLAIN (FORMAT JSON) EXECUTE young_claim ("
            + arguments.as_string(connection.connection).replace("%", "%%")
            + ")"
        )
        try:
            yield lambda: _scans(cur, explain)
        finally:
            cur.execute("DEALLOCATE young_claim")  # prepared statements outlive a rollback


def _scans(cur: Any, explain: str) -> list[str]:
    cur.execute(explain)
    value = cur.fetchone()[0]
    plan = json.loads(value) if isinstance(value, str) else value
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node:
            found.append(f"{node['Node Type']} {node.get('Index Name', '')}".strip())
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


@pytest.mark.django_db
def test_a_grown_table_is_analysed_and_the_claim_planned_again(young_table: Any) -> None:
    stats = TableStatistics()
    first = stats.run_once()  # never analysed: analysed at once, plans made on one page
    assert first["analyzed"] is True, first
    assert "Seq Scan" in young_table(), "on one page the UPDATE reads the table whole"
    assert stats.run_once()["analyzed"] is False  # nothing grew
    fill_jobs(40_000, 0, analyze=False)  # finished history, as test_perf_plans fills it
    # The failure this pass exists for: the cached plan still reads the whole table.
    assert "Seq Scan" in young_table()
    grown = stats.run_once()
    assert grown["analyzed"] is True, grown
    assert grown["pages"] >= max(FLOOR_PAGES, 2 * grown["planned"]), grown
    after = young_table()
    assert "Seq Scan" not in after, after
    assert "Index Scan pgjobs_job_claim_idx" in after, after
    assert stats.run_once()["analyzed"] is False  # statistics current: no ANALYZE


@pytest.mark.django_db
def test_a_role_that_does_not_own_the_table_only_looks(young_table: Any) -> None:
    """No ANALYZE (PostgreSQL would skip it with a WARNING every pass) and no error."""
    with connection.cursor() as cur:
        cur.execute("CREATE ROLE pgjobs_test_reader")
        cur.execute("SET LOCAL ROLE pgjobs_test_reader")
    try:
        result = TableStatistics().run_once()
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET ROLE")
    assert result["analyzed"] is False, result
    with connection.cursor() as cur:
        cur.execute(f"SELECT reltuples FROM pg_class WHERE oid = '{JOB}'::regclass")
        assert cur.fetchone()[0] < 0  # still never analysed
