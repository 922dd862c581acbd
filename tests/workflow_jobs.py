"""Jobs of the workflow tests (imported through PGJOBS["JOB_MODULES"], so runjobs
subprocesses know them too)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from django.db import connection

from django_pgjobs import JobContext, job


@job
def fetch(url: str) -> dict[str, Any]:
    return {"url": url, "body": url.upper()}


@job
def parse(page: dict[str, Any]) -> list[str]:
    return [page["body"], str(len(page["body"]))]


@job
def store(items: list[str], prefix: str = "") -> str:
    return prefix + "|".join(items)


@job
def double(x: int) -> int:
    return 2 * x


@job
def add_up(values: list[Any], extra: int = 0) -> int:
    return sum(v for v in values if v is not None) + extra


@job
def constant(value: Any) -> Any:
    return value


@job(max_attempts=1)
def explode(message: str = "boom") -> None:
    raise RuntimeError(message)


@job(takes_context=True)
def report_parents(context: JobContext, tag: str = "") -> dict[str, Any]:
    """Returns what it saw: its parents' results, by name."""
    return {"tag": tag, "parents": context.parent_results}


@job
def summarise(counts: dict[str, int], label: str = "") -> dict[str, Any]:
    return {"label": label, **counts}


def _note(context: JobContext, table: str, tag: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (job_id, tag, pid) VALUES (%s, %s, %s)",
            [context.job_id, tag, os.getpid()],
        )
    return tag


@job(takes_context=True, max_attempts=3)
def note(context: JobContext, table: str, tag: str, *results: Any) -> str:
    """Appends (job id, tag, pid) to ``table``: counts executions across processes."""
    return _note(context, table, tag)


@job(max_attempts=3)
def finish_at(deadline: float, value: int) -> int:
    """Sleeps until ``deadline`` (time.time()), so members on different workers
    finish at the same moment."""
    time.sleep(max(0.0, deadline - time.time()))
    return value


@job(max_attempts=2)
def wait_for_file(path: str, timeout: float = 60.0) -> str:
    end = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > end:
            raise TimeoutError(path)
        time.sleep(0.02)
    return path


@job(max_attempts=1, timeout=0.3)
def too_slow(seconds: float) -> None:
    time.sleep(seconds)


@job
async def async_double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


@job(queue="wf-other", priority=7)
def on_other_queue(x: int) -> int:
    return x + 1


@job(unique_while="active")
def unique_step(key: str) -> str:
    return key


@job(atomic=True, takes_context=True, max_attempts=20)
def note_once(context: JobContext, table: str, tag: str) -> str:
    """Like ``note``, but its row commits with its completion (``atomic=True``): a
    run whose worker was killed leaves no row, so rows count completions."""
    return _note(context, table, tag)


@job(max_attempts=20)
def sleep_value(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value
