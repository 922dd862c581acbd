"""The jobs table filled with history and the plans of statements on it, for the plan tests."""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import connection

from django_pgjobs.db.tables import JOB

HISTORY = 200_000


def fill_jobs(
    history: int,
    pending: int,
    queues: tuple[str, ...] = ("default", "emails"),
    *,
    analyze: bool = True,
) -> None:
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, status, run_at, created_at, started_at,"
            " finished_at, attempts, lease)"
            " SELECT 'history', (%(q)s::text[])[1 + g %% cardinality(%(q)s::text[])],"
            " 'completed', t, t, t, t, 1, 1"
            " FROM (SELECT g, now() - make_interval(secs => g) AS t"
            "       FROM generate_series(1, %(n)s) g) s",
            {"q": list(queues), "n": history},
        )
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, priority, run_at)"
            " SELECT 'live', (%(q)s::text[])[1 + g %% cardinality(%(q)s::text[])], g %% 3,"
            # The column default is statement_timestamp(), later than the claim's now()
            # inside this test's transaction.
            " now() - interval '1 second'"
            " FROM generate_series(1, %(n)s) g",
            {"q": list(queues), "n": pending},
        )
        if analyze:
            cur.execute(f"ANALYZE {JOB}")


def explain_json(statement: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        value = cur.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


def numbered_placeholders(statement: str) -> tuple[str, list[str]]:
    """``%(name)s`` placeholders as ``$1, $2 ...`` for PREPARE, and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, statement), names
