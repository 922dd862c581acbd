"""The claim is the queryset ``Job.objects.claimable(...)`` compiled into one
``WITH picked AS (...) UPDATE ... RETURNING`` statement: its text, compiled without
a connection (its plan and the queryset run: tests/db/test_claim_queryset.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection

from django_pgjobs import claim
from django_pgjobs.claim import compiled
from django_pgjobs.claim.plain import CLAIM_STATEMENTS
from django_pgjobs.jobs.managers import StatementParam
from django_pgjobs.models import Job

#: The inner SELECT of the one-queue claim, as compiled by Django 5.2 / 6.x.
PICKED_ONE_QUEUE = re.compile(
    r'SELECT "django_pgjobs_job"\."id"( AS "id")? FROM "django_pgjobs_job" WHERE \('
    r'"django_pgjobs_job"\."run_at" <= \(now\(\)\) AND '
    r"\"django_pgjobs_job\"\.\"status\" = 'pending' AND "
    r'"django_pgjobs_job"\."run_at" >= \(%\(since\)s\) AND '
    r'"django_pgjobs_job"\."queue" = \(%\(queue\)s\)\) '
    r'ORDER BY "django_pgjobs_job"\."priority" DESC, "django_pgjobs_job"\."run_at" ASC, '
    r'("django_pgjobs_job"\."id"|1) ASC LIMIT %\(n\)s FOR UPDATE SKIP LOCKED'
)


KNOWN = 'array_position(%(tasks)s::text[], ("django_pgjobs_job"."task")::text) IS NOT NULL'


def test_the_claim_is_the_compiled_queryset() -> None:
    statements = claim.claim_statements(connection)
    assert tuple(statements) == CLAIM_STATEMENTS
    one = statements["JOB_CLAIM_ONE_QUEUE"]
    picked = one.split("WITH picked AS (", 1)[1].split("\n)\n", 1)[0].strip()
    assert PICKED_ONE_QUEUE.fullmatch(picked), picked
    for name, text in statements.items():
        # named parameters only (psycopg takes one style per statement)
        assert not re.search(r"%s|%\d", text.replace("%%", "")), (name, text)
        assert text.count("FOR UPDATE SKIP LOCKED") == 1, name
        assert ("IS NOT NULL" in text and KNOWN in text) == name.endswith("_KNOWN"), name
    for name in ("JOB_CLAIM_QUEUES", "JOB_CLAIM_ALL", "JOB_CLAIM_LEVELS"):
        assert '"django_pgjobs_job"."queue" = (qs.name)' in statements[name]
        assert "CROSS JOIN LATERAL (SELECT" in statements[name]
    # The single round trip: the set of claimed rows and the UPDATE are one statement.
    assert one.strip().startswith("WITH picked AS (") and "RETURNING j.id" in one


def test_compiling_the_claim_never_connects() -> None:
    # A backend pointed at an address nothing listens on: compiling must not care.
    settings = {**connection.settings_dict, "HOST": "203.0.113.1", "NAME": "nowhere"}
    offline = type(_wrapper())(settings, alias="pgjobs-compile-test")
    statements = compiled.compile_claims(offline)
    assert offline.connection is None
    assert statements == claim.claim_statements(connection)


def _wrapper() -> Any:
    from django.db import connections

    return connections[connection.alias]


def test_a_parameter_the_claim_cannot_pass_is_refused() -> None:
    queryset = Job.objects.claimable(StatementParam("queue")).filter(task="x").values("id")
    text, params = (
        queryset[: compiled._LIMIT_MARK]
        .query.get_compiler(connection=compiled._offline(_wrapper()))
        .as_sql()
    )
    with pytest.raises(ValueError, match="a parameter the claim cannot pass: 'x'"):
        compiled._named(text, params)
