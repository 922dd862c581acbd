"""The minute rollup against its ground truth, a plain ``GROUP BY`` over the jobs table."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django_pgjobs.db.tables import JOB, MINUTE, ROLLUP_MARK
from tests.helpers.rows import query


def counts_of(sql: str) -> Counter[tuple[Any, ...]]:
    """``{(key...): n}`` of a query whose last column is a count."""
    return Counter({tuple(row[:-1]): row[-1] for row in query(sql)})


def truth() -> Counter[tuple[Any, ...]]:
    """Jobs finished before the mark, per minute, queue and status, from the jobs table."""
    return counts_of(
        f"SELECT date_trunc('minute', finished_at), queue, status, count(*) FROM {JOB}"
        f" WHERE finished_at >= (SELECT rolled_from FROM {ROLLUP_MARK})"
        f"   AND finished_at < (SELECT rolled_to FROM {ROLLUP_MARK})"
        " GROUP BY 1, 2, 3"
    )


def rolled() -> Counter[tuple[Any, ...]]:
    return counts_of(f"SELECT minute, queue, status, finished FROM {MINUTE} WHERE finished > 0")
