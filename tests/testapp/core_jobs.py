"""Jobs for the worker's error-path, timeout and async tests (tests/faults/test_worker_errors.py,
tests/db/test_async_jobs.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection

from django_pgjobs import JobContext, job


class ExitingStr(Exception):
    """An exception whose ``__str__`` raises SystemExit."""

    def __str__(self) -> str:
        raise SystemExit("str of this exception exits")


@job(max_attempts=2)
def hostile(kind: str) -> Any:
    """Values and exceptions that used to break the worker's own threads."""
    if kind == "deep":
        value: list[Any] = []
        for _ in range(5000):
            value = [value]
        return value
    if kind == "exiting_str":
        raise ExitingStr
    if kind == "huge_int":
        return 10**5000
    if kind == "big":
        return "x" * 200
    return "ok"


@job(max_attempts=2, timeout=1)
def sleeps_past_timeout(seconds: float = 5.0) -> str:
    time.sleep(seconds)
    return "finished late"


@job(max_attempts=1, takes_context=True)
def watches_cancel(context: JobContext, seconds: float = 10.0) -> bool:
    """Sleeps until the worker gives up on it; returns whether it saw the cancel."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if context.is_cancelled():
            return True
        time.sleep(0.02)
    return False


@job(max_attempts=1)
async def async_sleep(seconds: float = 0.05) -> list[float]:
    """Returns when it really ran: [start, end] (epoch seconds)."""
    start = time.time()
    await asyncio.sleep(seconds)
    return [start, time.time()]


@job(max_attempts=1, timeout=0.5)
async def async_past_timeout(seconds: float = 30.0) -> None:
    await asyncio.sleep(seconds)


@job(max_attempts=1)
async def async_orm_count() -> int:
    from django_pgjobs.models import Job

    return await Job.objects.acount()


@job(max_attempts=3)
async def async_orm_count_retried() -> int:
    from django_pgjobs.models import Job

    return await Job.objects.acount()


@job(max_attempts=1)
def nap(seconds: float) -> None:
    """A slow job for the fairness test."""
    time.sleep(seconds)


# Hostile jobs: what a job may do to the worker's
# event loop and process; tests/process/test_hostile_jobs.py.


@job(max_attempts=1)
async def stops_the_loop() -> str:
    asyncio.get_running_loop().stop()
    await asyncio.sleep(0.2)
    return "stopped the loop"


@job(max_attempts=1)
async def closes_the_loop() -> str:
    asyncio.get_running_loop().close()
    return "closed the loop"


@job(max_attempts=1)
async def spawns_an_exit(kind: str) -> str:
    """Spawns a task that raises SystemExit or KeyboardInterrupt out of the loop."""

    async def exits() -> None:
        raise SystemExit("a spawned task exits") if kind == "exit" else KeyboardInterrupt

    asyncio.get_running_loop().create_task(exits())
    await asyncio.sleep(0.3)
    return "spawned " + kind


@job(max_attempts=1)
async def blocks_the_loop(seconds: float) -> str:
    time.sleep(seconds)
    return "blocked"


@job(max_attempts=1)
async def cancels_every_task(after: float = 0.5) -> int:
    """Cancels every task of the loop it runs on, its neighbours' and its own."""
    tasks = asyncio.all_tasks()
    for task in tasks:
        task.cancel()
    await asyncio.sleep(after)
    return len(tasks)


@job(max_attempts=1)
async def cancels_the_others() -> int:
    """Cancels every task of the loop but its own, from a task it spawns, and returns."""

    async def cancel() -> int:
        mine = {asyncio.current_task(), spawner}
        others = [t for t in asyncio.all_tasks() if t not in mine]
        for task in others:
            task.cancel()
        return len(others)

    spawner = asyncio.current_task()
    return await asyncio.get_running_loop().create_task(cancel())


@job(max_attempts=1)
def forks(path: str, raise_in_child: bool = False) -> int:
    """Forks and returns in both processes; the child writes its pid to ``path``."""
    import os

    pid = os.fork()
    if pid == 0:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        if raise_in_child:
            raise ValueError("the child raises")
        return 0
    return pid


@job(max_attempts=1)
def holds_gil_on_cue(folder: str, seconds: int) -> str:
    """Waits (GIL free) for ``folder``/go, writes ``folder``/holding, then holds the GIL
    for ``seconds`` in ONE C call (libc ``sleep`` through ``ctypes.PyDLL``, which does
    not release it: exact, unlike a backtracking regex), then writes ``folder``/released."""
    import ctypes
    from pathlib import Path

    where = Path(folder)
    deadline = time.monotonic() + 120
    while not (where / "go").exists():
        if time.monotonic() > deadline:
            return "no cue"
        time.sleep(0.02)
    (where / "holding").write_text(str(time.time()))
    ctypes.PyDLL(None).sleep(seconds)
    (where / "released").write_text(str(time.time()))
    return "held"


@job(max_attempts=1)
async def async_leaves_transaction_open(table: str, n: int) -> int:
    """Writes ``n`` into ``table`` through the ORM's thread after a raw BEGIN and
    returns without COMMIT."""

    def write() -> None:
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"INSERT INTO {table} (n) VALUES (%s)", [n])

    await sync_to_async(write)()
    return n


@job(max_attempts=1)
async def async_writes_n(table: str, n: int) -> int:
    def write() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} (n) VALUES (%s)", [n])

    await sync_to_async(write)()
    return n


@job(max_attempts=1)
async def async_sleeps_in_the_database(seconds: float) -> None:
    """Holds the async jobs' shared ORM thread in one query for ``seconds``."""

    def sleep() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s)", [seconds])

    await sync_to_async(sleep)()


@job(max_attempts=1, timeout=1.0)
async def async_times_out_in_a_transaction(table: str) -> None:
    """BEGIN and a write on the shared ORM connection, then sleeps past its timeout."""

    def write() -> None:
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"INSERT INTO {table} (n) VALUES (1)")

    await sync_to_async(write)()
    await asyncio.sleep(30)
