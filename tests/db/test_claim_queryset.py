"""The claim is the queryset ``Job.objects.claimable(...)`` compiled into one
``WITH picked AS (...) UPDATE ... RETURNING`` statement: its text, its plan, and the
queryset used on its own."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.db import connection, transaction

from django_pgjobs import claim
from django_pgjobs.claim.plain import task_array
from django_pgjobs.db.tables import JOB
from django_pgjobs.models import Job
from tests.helpers.rows import make_job


@pytest.mark.django_db
def test_claimable_is_an_ordinary_queryset_too() -> None:
    low = make_job(priority=-5, queue="a", run_at_delta=-30)
    high = make_job(priority=50, queue="a", run_at_delta=-1)
    other = make_job(queue="b", task="tests.testapp.jobs.noop", args=[])
    make_job(queue="a", run_at_delta=3600)  # not due
    make_job("completed", queue="a")
    with transaction.atomic():
        assert list(Job.objects.claimable("a")) == [high, low]
        assert list(Job.objects.claimable(["a", "b"], tasks=["tests.testapp.jobs.noop"])) == [other]
        assert [j.id for j in Job.objects.claimable()] == [high.id, other.id, low.id]


def _plan(statement: str, params: dict[str, Any]) -> dict[str, Any]:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        value = cur.fetchone()[0]
    return (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]


def _scans_below_a_sort(node: dict[str, Any], sorted_since_limit: bool = False) -> list[str]:
    """Scans of the jobs table that a Sort reads before any LIMIT cuts them: a sort
    of the whole backlog (a Sort above a Limit, of at most n rows per queue, is fine)."""
    kind = node["Node Type"]
    if kind == "Limit":
        sorted_since_limit = False
    elif kind in ("Sort", "Incremental Sort"):
        sorted_since_limit = True
    found = []
    if sorted_since_limit and node.get("Relation Name") == JOB:
        found.append(f"{kind} {node.get('Index Name', '')}")
    for child in node.get("Plans", []):
        found += _scans_below_a_sort(child, sorted_since_limit)
    return found


def _index_names(node: dict[str, Any]) -> set[str]:
    names = {node["Index Name"]} if "Index Name" in node else set()
    for child in node.get("Plans", []):
        names |= _index_names(child)
    return names


def _fill_history_and_backlog() -> None:
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, status, run_at, started_at, finished_at,"
            " attempts, lease)"
            " SELECT 'history', 'q' || (g % 3), 'completed', now(), now(), now(), 1, 1"
            " FROM generate_series(1, 50000) g"
        )
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, priority, run_at)"
            " SELECT 'live', 'q' || (g % 3), g % 5, now() - interval '1 second'"
            " FROM generate_series(1, 5000) g"
        )
        cur.execute(f"ANALYZE {JOB}")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("JOB_CLAIM_ONE_QUEUE", {"queue": "q1"}),
        ("JOB_CLAIM_QUEUES", {"queues": ["q1", "q2"]}),
        ("JOB_CLAIM_ALL", {}),
        ("JOB_CLAIM_ONE_QUEUE_KNOWN", {"queue": "q1"}),
        ("JOB_CLAIM_ALL_KNOWN", {}),
        ("JOB_CLAIM_LEVELS", {"queues": ["q1", "q2"], "levels": [4, 2, 0]}),
        ("JOB_CLAIM_LEVELS_KNOWN", {"queues": ["q1"], "levels": [3]}),
    ],
)
def test_the_compiled_claim_reads_the_claim_index_without_sorting_the_backlog(
    name: str, extra: dict[str, Any]
) -> None:
    _fill_history_and_backlog()
    params = {
        "worker": "w",
        "n": 10,
        "since": claim.UNBOUNDED,
        "tasks": task_array(("live", "x")),
        **extra,
    }
    plan = _plan(claim.claim_statements(connection)[name], params)
    assert "pgjobs_job_claim_idx" in _index_names(plan), plan
    assert _scans_below_a_sort(plan) == [], plan
    assert '"Seq Scan"' not in json.dumps(plan), plan


@pytest.mark.django_db
def test_the_generic_plan_of_the_prepared_claim_uses_the_claim_index_too() -> None:
    # The hot path runs the claim as a prepared statement; after a few executions the
    # server may switch to a generic plan, which knows no parameter values. The
    # status is a literal, so the partial index still matches.
    _fill_history_and_backlog()
    statement = claim.claim_statements(connection)["JOB_CLAIM_ONE_QUEUE_KNOWN"]
    names: list[str] = []

    def positional(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", positional, statement)
    values = {"queue": "q1", "n": 10, "worker": "w", "tasks": "{live}"}
    values["since"] = "-infinity"
    args = ", ".join(
        f"'{values[n]}'" if isinstance(values[n], str) else str(values[n]) for n in names
    )
    with connection.cursor() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute(f"PREPARE pgjobs_claim_test AS {prepared}".replace("%", "%%"))
        try:
            cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE pgjobs_claim_test({args})")
            value = cur.fetchone()[0]
        finally:
            cur.execute("DEALLOCATE pgjobs_claim_test")
    plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
    assert "pgjobs_job_claim_idx" in _index_names(plan), plan
    assert _scans_below_a_sort(plan) == [], plan
