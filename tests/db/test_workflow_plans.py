"""What workflows cost the database: no statement of a member's completion grows with
the number of its siblings, a 10,000-member chord enqueues in a few statements, and
a plain job's statements find no workflow work to do.

Costs are read from ``pg_stat_xact_user_tables`` (this transaction's own table
access, triggers and functions included): sequential scans and tuples fetched.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_pgjobs.db import workflows as workflow_db
from django_pgjobs.db.workflow_trigger import WORKFLOW_FUNCTIONS
from django_pgjobs.models import Job
from django_pgjobs.workflows import writer
from tests import workflow_jobs as w
from tests.helpers.workflow_costs import chord_of, complete_cost, member_costs

pytestmark = pytest.mark.django_db


def prepare(n: int) -> list[Job]:
    """An n-member chord with all but two members finished already."""
    jobs = chord_of(n, f"q{n}")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_pgjobs_job SET status = 'completed', finished_at = now()"
            " WHERE id = ANY(%s)",
            [[j.id for j in jobs[: n - 2]]],
        )
    return jobs


def test_no_statement_of_a_completion_grows_with_the_siblings() -> None:
    warm, small, big = prepare(3), prepare(10), prepare(3000)
    with connection.cursor() as cursor:  # both measured on the same tables and statistics
        cursor.execute("ANALYZE django_pgjobs_job")
        cursor.execute("ANALYZE django_pgjobs_jobdependency")
    member_costs(warm)  # the session's first completion and release, not measured
    small_one, small_last = member_costs(small)
    big_one, big_last = member_costs(big)
    for table in ("django_pgjobs_job", "django_pgjobs_jobdependency"):
        for spent in (small_one, small_last, big_one, big_last):
            assert spent[table][0] == 0, f"a sequential scan of {table}: {spent}"
        # 300 times the siblings, the same work (give or take a primary-key probe or
        # two: plans follow the statistics; a cost per sibling would be thousands)
        # the big chord may not cost more (a one-off of a few tuples on the small side,
        # seen with the trigger's v2, is not a cost that grows with the siblings)
        assert big_one[table][1] - small_one[table][1] <= 4, (table, small_one, big_one)
        assert big_last[table][1] - small_last[table][1] <= 4, (table, small_last, big_last)


def test_a_plain_completion_touches_no_workflow_table() -> None:
    job = w.double.using(queue="plain").enqueue(1)
    spent = complete_cost(job)
    assert spent["django_pgjobs_jobdependency"] == (0, 0, 0)
    assert spent["django_pgjobs_workflow"] == (0, 0, 0)


def test_a_10000_member_chord_enqueues_in_a_few_statements() -> None:
    n = 10_000
    with CaptureQueriesContext(connection) as queries:
        jobs = chord_of(n, "big")
    ours = [
        q["sql"]
        for q in queries.captured_queries
        if "django_pgjobs" in q["sql"] and "SAVEPOINT" not in q["sql"]
    ]
    # the run row with every id, then the nodes and edges in chunks
    assert len(ours) == 1 + -(-(n + 1) // writer.CHUNK), [q[:80] for q in ours]
    assert len(jobs) == n + 1 and jobs[-1].waiting == n
    assert Job.objects.filter(workflow_id=jobs[0].workflow_id).count() == n + 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM django_pgjobs_jobdependency WHERE child_id = %s", [jobs[-1].id]
        )
        assert cursor.fetchone()[0] == n


def test_the_step_locks_children_through_the_edges_index() -> None:
    """The lock of the children and the aggregate of the edges read the edges by
    parent (pgjobs_dep_parent_idx), never the whole table."""
    chord_of(200, "plan")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_pgjobs_jobdependency")
        cursor.execute(
            "EXPLAIN SELECT e.child_id FROM django_pgjobs_jobdependency e"
            " WHERE e.parent_id = ANY (ARRAY[1, 2]::bigint[])"
        )
        plan = "\n".join(r[0] for r in cursor.fetchall())
    assert "pgjobs_dep_parent_idx" in plan, plan
    assert workflow_db.DEPENDENCY in WORKFLOW_FUNCTIONS
