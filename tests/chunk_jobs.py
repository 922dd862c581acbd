"""Chunk handlers for tests/db/test_chunks.py and tests/process/test_chunks_process.py (loaded
by PGJOBS["JOB_MODULES"], so ``runjobs`` workers know them too).

Each handler records its call in ``CALLS`` (the job ids it got, the process that
ran it), in autocommit on the job thread's own connection."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from django.db import connection

from django_pgjobs import ChunkItem, job

CALLS = "pgjobs_test_chunk_calls"


def create_calls() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {CALLS} (n bigserial PRIMARY KEY, task text,"
            " job_ids bigint[], pid int)"
        )
        cursor.execute(f"TRUNCATE {CALLS}")


def calls(task: str) -> list[list[int]]:
    """The job ids of each recorded call of ``task``'s handler, in call order."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT job_ids FROM {CALLS} WHERE task = %s ORDER BY n", [task])
        return [list(row[0]) for row in cursor.fetchall()]


def record(task: str, items: list[ChunkItem]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {CALLS} (task, job_ids, pid) VALUES (%s, %s, %s)",
            [task, [item.job_id for item in items], os.getpid()],
        )


@job(queue="chunks", chunk=100, chunk_wait=timedelta(milliseconds=200))
def collect(items: list[ChunkItem]) -> None:
    """Every job completes."""
    record("collect", items)


@job(queue="chunks", chunk=10, max_attempts=3)
def doubles(items: list[ChunkItem]) -> dict[int, Any]:
    """Each job's result is twice its argument; an argument "bad" fails that job."""
    record("doubles", items)
    return {
        item.job_id: ValueError(f"bad item of job {item.job_id}")
        if item.args[0] == "bad"
        else item.args[0] * 2
        for item in items
    }


@job(queue="chunks", chunk=10, max_attempts=2)
def raises(items: list[ChunkItem]) -> None:
    """The whole call fails."""
    record("raises", items)
    raise RuntimeError("the chunk's API call failed")


@job(queue="chunks", chunk=10, takes_context=True, chunk_wait=0.5)
def waits_for_cancel(items: list[ChunkItem]) -> None:
    """Runs until one of its jobs is cancelled (its context says so), then returns
    None: every job of the chunk completed, as far as the handler knows."""
    record("waits_for_cancel", items)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(item.context is not None and item.context.is_cancelled() for item in items):
            return
        time.sleep(0.05)


@job(queue="chunk-crash", chunk=10, chunk_wait=timedelta(seconds=1), max_attempts=1)
def crashes(items: list[ChunkItem]) -> None:
    """Sleeps the longest ``pause`` of its items, then takes its process down
    (``os._exit(9)``) when an item's argument is "crash"."""
    record("crashes", items)
    time.sleep(max(float(item.kwargs.get("pause", 0)) for item in items))
    if any(item.args[0] == "crash" for item in items):
        os._exit(9)


@job(queue="chunks-slow", chunk=10, chunk_wait=0.3, max_attempts=1)
def sleeps(items: list[ChunkItem]) -> None:
    """Sleeps the longest of its items' arguments (seconds)."""
    record("sleeps", items)
    time.sleep(max(float(item.args[0]) for item in items))


@job(queue="chunks-patient", chunk=10, chunk_wait=30)
def patient(items: list[ChunkItem]) -> None:
    """Waits long to fill its chunk: a stopping worker calls it at once instead."""
    record("patient", items)


@job(chunk=10, chunk_wait=0.3)
def fault_chunk(items: list[ChunkItem]) -> None:
    """The fault matrix's chunk (setup="chunk", tests/faults/matrix.py): every job
    completes; its lead's fill issues the chunk's claim."""


@job(queue="chunks", chunk=5)
async def async_sums(items: list[ChunkItem]) -> dict[int, int]:
    """An async chunk handler: each job's result is the sum of its arguments."""
    return {item.job_id: sum(item.args) for item in items}
