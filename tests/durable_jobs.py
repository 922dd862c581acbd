"""Jobs of the durable-job tests (imported through PGJOBS["JOB_MODULES"]).

Side effects a test counts: in this process, ``CALLS`` (run_jobs tests); across
worker processes, auth ``Group`` rows (an atomic step's writes, one row per name) and
the ``calls`` step function's appends to a file named by PGJOBS_TEST_CALLS.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import Group

from django_pgjobs import JobContext, job

CALLS: list[str] = []
#: The "deployed code" of the code-change tests: which version of a job runs.
CODE = {"version": 1}


def call(name: str, value: Any = None) -> Any:
    CALLS.append(name)
    path = os.environ.get("PGJOBS_TEST_CALLS")
    if path:
        with open(path, "a") as out:
            out.write(f"{name}\n")
    return value


def fail(message: str) -> None:
    CALLS.append("fail")
    raise ValueError(message)


@job(takes_context=True, queue="durable")
def three_steps(context: JobContext, n: int) -> list[Any]:
    a = context.step("a", call, "a", n + 1)
    context.sleep("nap", timedelta(hours=1))
    b = context.step("b", call, "b", a * 10)
    return [a, b]


@job(takes_context=True, queue="durable", max_attempts=3)
def fails_after_a_step(context: JobContext) -> str:
    context.step("first", call, "first", 1)
    if len([c for c in CALLS if c == "fail"]) < 1:
        context.step("second", fail, "the first try fails")
    context.step("second", call, "second", 2)
    return "done"


@job(takes_context=True, queue="durable")
def grants(context: JobContext, name: str) -> int:
    with context.atomic_step("grant") as step:
        CALLS.append("grant-block")
        step.result = Group.objects.create(name=name).id
    context.sleep("settle", timedelta(minutes=5))
    with context.atomic_step("grant-2"):
        Group.objects.create(name=f"{name}-2")
    return int(step.result)


@job(takes_context=True, queue="durable")
def versioned(context: JobContext) -> list[str]:
    """Version 1: a, sleep, b. Version 2 (reordered): b before a. Version 3: v2's
    change behind patched(). Version 4: v1 plus a step after the sleep."""
    version = CODE["version"]
    if version == 2:
        return [context.step("b", call, "b", "b"), context.step("a", call, "a", "a")]
    if version == 3 and context.patched("b-first"):
        return [context.step("b", call, "b", "b"), context.step("a", call, "a", "a")]
    out = [context.step("a", call, "a", "a")]
    context.sleep("nap", timedelta(hours=1))
    if version == 4:
        out.append(context.step("added", call, "added", "added"))
    out.append(context.step("b", call, "b", "b"))
    return out


@job(takes_context=True)
def fault_durable(context: JobContext) -> list[Any]:
    """The fault matrix's durable job: a step, a short sleep (the job parks, the wake
    pass wakes it), a step; of the default queue, like the matrix's other jobs."""
    a = context.step("a", call, "fault-a", context.job_id)
    context.sleep("nap", 0.5)
    return [a, context.step("b", call, "fault-b", "b")]


@job(takes_context=True, queue="durable")
def many_steps(context: JobContext, n: int) -> int:
    for i in range(n):
        context.step("tick", call, "tick", i)
    return n


@job(takes_context=True, queue="durable")
def sleeps(context: JobContext, seconds: float) -> float:
    start = context.step("start", time.time)
    context.sleep("wait", seconds)
    return time.time() - start


@job(takes_context=True, queue="durable")
async def async_sleeps(context: JobContext, seconds: float) -> list[Any]:
    a = await context.astep("a", call, "async-a", 1)
    await context.asleep("wait", seconds)
    b = await context.astep("b", call, "async-b", 2)
    return [a, b]


def _once(marker: str) -> bool:
    """True the first time it is asked about ``marker`` (a file), on this host."""
    if os.path.exists(marker):
        return False
    with open(marker, "w") as out:
        out.write(str(os.getpid()))
    return True


@job(takes_context=True, queue="durable-proc")
def crashing_grants(context: JobContext, name: str, marker_dir: str) -> list[int]:
    """Two atomic steps; the first run's worker is SIGKILLed inside the second's block,
    after its row was written and before it committed."""
    with context.atomic_step("grant-1") as first:
        first.result = Group.objects.create(name=f"{name}-1").id
    with context.atomic_step("grant-2") as second:
        second.result = Group.objects.create(name=f"{name}-2").id
        if _once(os.path.join(marker_dir, "killed")):
            os.kill(os.getpid(), signal.SIGKILL)
    return [first.result, second.result]


@job(takes_context=True, queue="durable-proc")
def frozen_grant(context: JobContext, name: str, marker_dir: str) -> int:
    """An atomic step whose first run freezes its worker (SIGSTOP) inside the block: the
    job is reclaimed and finished elsewhere while the zombie holds its transaction."""
    with context.atomic_step("grant") as step:
        step.result = Group.objects.create(name=f"{name}-lease-{context.lease}").id
        if context.lease == 1:
            with open(os.path.join(marker_dir, "frozen"), "w") as out:
                out.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
            # The stop reaches this thread a moment after the call returns: without the
            # wait it could leave the block and record the step before it stops.
            time.sleep(2.0)
    return int(step.result)


@job(takes_context=True, queue="durable-proc", max_attempts=1)
def writes_elsewhere(context: JobContext, name: str) -> None:
    """An atomic step that writes through the alias ``other`` (tests/settings_two_aliases.py)."""
    with context.atomic_step("grant"):
        Group.objects.create(name=f"{name}-default")
        Group.objects.using("other").create(name=f"{name}-other")


@job(takes_context=True, queue="durable", atomic=True)
def atomic_sleeper(context: JobContext) -> None:
    """A sleep inside a whole-job transaction: refused clearly."""
    context.step("a", call, "a", 1)
    context.sleep("nap", 60)


@job(takes_context=True, queue="durable-bench")
def ten_steps(context: JobContext) -> None:
    """bench/durable_steps.py: ten recorded steps."""
    for i in range(10):
        context.step(f"s{i}", int, i)


@job(queue="durable-bench")
def ten_writes() -> None:
    """bench/durable_steps.py: the same job making ten plain single-row writes."""
    from django.db import connection

    with connection.cursor() as cursor:
        for i in range(10):
            cursor.execute("INSERT INTO durable_bench_rows (n) VALUES (%s)", [i])


def fake_service(log_dir: str, order: int, what: str) -> str:
    """An external call: logged, answering a value of its own each time (a step
    replayed from its record returns the first answer, never a new one)."""
    answer = uuid.uuid4().hex
    time.sleep(0.2)  # a network call: long enough for a kill to land inside a run
    with open(os.path.join(log_dir, "service.log"), "a") as out:
        out.write(f"{order} {what} {answer}\n")
    return answer


def _row(order: int, step: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO chaos_rows (ord, step) VALUES (%s, %s)", [order, step])


@job(takes_context=True, queue="durable-chaos", max_attempts=25)
def chaos_order(context: JobContext, order: int, log_dir: str) -> list[str]:
    """Six steps: a service call, an atomic write, a service call, a sleep, an atomic
    write, a service call; every run appends the answers it saw."""
    charge = context.step("charge", fake_service, log_dir, order, "charge")
    with context.atomic_step("reserve"):
        _row(order, "reserve")
    ship = context.step("ship", fake_service, log_dir, order, "ship")
    context.sleep("wait", 1.0)
    with context.atomic_step("invoice"):
        _row(order, "invoice")
    review = context.step("review", fake_service, log_dir, order, "review")
    with open(os.path.join(log_dir, "seen.log"), "a") as out:
        out.write(f"{order} {charge} {ship} {review}\n")
    return [charge, ship, review]
