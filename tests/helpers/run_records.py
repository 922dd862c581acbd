"""Runs recorded by the test jobs themselves: a row when a run starts and one when
it ends, written in autocommit on the job thread's own connection, so a run the
worker gave up on (timed out, cancelled, reclaimed) still records when its thread
really ended. The limits tests read overlaps from these rows, not from the job
table (which forgets a run the moment it is written off)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connection

TABLE = "pgjobs_test_runs"


def create() -> None:
    """The table, empty (the test database's other tables are flushed per test)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (run text PRIMARY KEY, job_id bigint,"
            " lease bigint, key text, started double precision, ended double precision)"
        )
        cursor.execute(f"TRUNCATE {TABLE}")


@contextmanager
def _run(context: Any, key: str) -> Iterator[None]:
    """A row when the block starts, its end time when it ends."""
    run = uuid.uuid4().hex
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (run, job_id, lease, key, started) VALUES (%s, %s, %s, %s, %s)",
            [run, context.job_id, context.lease, key, time.time()],
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET ended = %s WHERE run = %s", [time.time(), run])


def recorded(context: Any, key: str, seconds: float) -> None:
    """Sleep ``seconds`` (ignoring cancellation, like a long C call), recording the run."""
    with _run(context, key):
        time.sleep(seconds)


def hold_gil(seconds: float) -> float:
    """Hold the GIL for at least ``seconds`` in ONE C call: a regular expression that
    backtracks catastrophically (``(a+)+$`` on ``a...ab``, twice as long per added
    ``a``), one ``a`` longer each call until a call took ``seconds`` (timings on a
    loaded machine are too noisy to size it from a short call). Returns how long that
    last call took."""
    pattern = re.compile(r"(a+)+$")
    size, took = 18, 0.0
    while took < seconds:
        began = time.perf_counter()
        pattern.match("a" * size + "b")
        took = time.perf_counter() - began
        size += 1
    return took


def recorded_gil(context: Any, key: str, seconds: float) -> float:
    """``hold_gil(seconds)``, the run recorded."""
    with _run(context, key):
        return hold_gil(seconds)


def runs(key: str) -> list[tuple[float, float, int]]:
    """(start, end, job id) of every run of ``key``; a run still going ends at +inf."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT started, COALESCE(ended, 'infinity'), job_id FROM {TABLE}"
            " WHERE key = %s ORDER BY started",
            [key],
        )
        return [(r[0], r[1], r[2]) for r in cursor.fetchall()]


def unfinished(key: str) -> int:
    """Runs of ``key`` that started and have not ended yet."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE key = %s AND ended IS NULL", [key])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def max_overlap(intervals: Sequence[tuple[float, float, Any]]) -> int:
    """Most runs in progress at one instant (an end before a start at a tie)."""
    events = sorted([(s, 1) for s, _, _ in intervals] + [(e, -1) for _, e, _ in intervals])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak
