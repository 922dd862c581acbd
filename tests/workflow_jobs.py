"""Jobs of the workflow tests (imported through PGJOBS["JOB_MODULES"], so runjobs
subprocesses know them too)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pickle
import random
import time
from collections.abc import Sequence
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


@job
def blob(size: int, seed: int, packed: bool = False) -> str:
    """A result of ``size`` characters that starts with ``"<seed>:"``: random hex
    (stored as it is), or one letter repeated (stored compressed) when ``packed``."""
    head = f"{seed}:"
    if packed:
        return head + chr(97 + seed % 26) * (size - len(head))
    return head + random.Random(seed).randbytes(size // 2 + 1).hex()[: size - len(head)]


@job(takes_context=True)
def walk_results(context: JobContext, results: Sequence[Any]) -> dict[str, Any]:
    """Reads every result once through the chord's list and once through
    ``parent_results``; returns each one's head (its seed) and the total size."""
    heads = [value[: value.index(":")] for value in results]  # no copy of the rest
    size = sum(len(value) for value in context.parent_results.values())
    return {"heads": heads, "size": size}


@job
def size_results(results: Sequence[Any]) -> int:
    """The results' total size, each read by index and let go before the next is
    read (a callback that keeps none, as ``map`` over them would)."""
    return sum(len(results[i]) for i in range(len(results)))


def _head(value: Any) -> Any:
    return f"{value[:12]}/{len(value)}" if isinstance(value, str) else value


@job(takes_context=True)
def probe_results(context: JobContext, results: Sequence[Any]) -> dict[str, Any]:
    """What a callback sees through the list and the mapping it is given (each
    string result by its head and length)."""
    parents = context.parent_results
    names = list(parents)
    return {
        "len": len(results),
        "list": [_head(v) for v in results],
        "again": [_head(v) for v in results],  # a second pass reads them again
        "reversed": [_head(v) for v in reversed(results)],
        "index": [_head(results[i]) for i in (0, -1, len(results) // 2)],
        "slice": [_head(v) for v in results[1:4]],
        "eq": results == list(results),
        "in": results[2] in results,
        "names": names,
        "by_name": [_head(parents[n]) for n in names],
        "items": {n: _head(v) for n, v in parents.items()},
        "get": [_head(parents.get(names[0])), parents.get("nobody", "none")],
        "has": [names[-1] in parents, "nobody" in parents],
        "pickled": pickle.loads(pickle.dumps(results)) == list(results),  # noqa: S301 - our own bytes
    }


def digest_of(values: Any) -> str:
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()


@job
def digest(results: Sequence[Any]) -> str:
    """The digest of the chord's results (too large to return)."""
    return digest_of(list(results))


@job(takes_context=True)
def collect(context: JobContext, results: Sequence[Any]) -> dict[str, Any]:
    """Returns the list and the mapping it was given, nested: stored as JSON."""
    return {"type": type(results).__name__, "values": results, "parents": context.parent_results}


@job
async def async_collect(results: list[Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"type": type(results).__name__, "values": results}


@job(takes_context=True, max_attempts=1)
def read_after_delete(context: JobContext, results: Sequence[Any]) -> list[Any]:
    """Deletes its first parent's stored result (as a hand in psql could) after it
    started, then reads its results."""
    first = int(next(iter(context.parent_results)))
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_pgjobs_jobresult WHERE job_id = %s", [first])
    return list(results)


@job(max_attempts=1)
def dies_until(path: str, value: int, go: str = "", timeout: float = 60.0) -> int:
    """Dies while ``path`` is missing; once it exists, waits for ``go`` (if given) and
    returns ``value``: a parent that dies, then completes when retried."""
    if not Path(path).exists():
        raise RuntimeError(f"{path} is missing")
    end = time.monotonic() + timeout
    while go and not Path(go).exists():
        if time.monotonic() > end:
            raise TimeoutError(go)
        time.sleep(0.02)
    return value


@job(takes_context=True, max_attempts=1)
def needs_parents(context: JobContext) -> dict[str, Any]:
    """Dies when a parent left no result: a child that ran before its parent completed
    dies."""
    missing = sorted(name for name, value in context.parent_results.items() if value is None)
    if missing:
        raise RuntimeError(f"no result from {missing}")
    return context.parent_results
