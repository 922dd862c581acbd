"""Jobs of the signal and event tests (imported through PGJOBS["JOB_MODULES"]).

``HOOK``: called by ``parks_then_hook`` between its wait's look and the park (the
wait's ``Parked`` passes through it), so a test commits a signal or an event in that
window from another connection. ``RUNS``: each run's start, in this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django_pgjobs import JobContext, job

HOOK: dict[str, Callable[[], None] | None] = {"after_look": None, "before_wait": None}
RUNS: list[int] = []


@job(takes_context=True, queue="durable")
def approval(context: JobContext, timeout: float | None = None) -> Any:
    RUNS.append(context.job_id)
    answer = context.wait_for_signal("approval", timeout=timeout)
    return {"answer": answer}


@job(takes_context=True, queue="durable", max_attempts=3)
def approval_then_fail_once(context: JobContext) -> Any:
    """Fails after its wait on its first run: the retry must get the same payload."""
    RUNS.append(context.job_id)
    answer = context.wait_for_signal("approval")
    if RUNS.count(context.job_id) == 1:
        raise RuntimeError("after the wait, the first run fails")
    return answer


@job(takes_context=True, queue="durable")
def polls_for_stop(context: JobContext, limit: float) -> Any:
    """Runs, polling for signal "stop" (a wait that times out at once), until one
    comes or ``limit`` seconds pass: a running job that a signal finds running."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        stop = context.wait_for_signal("stop", timeout=0)
        if stop is not None:
            return {"stop": stop}
        time.sleep(0.1)
    return {"stop": None}


@job(takes_context=True, queue="durable")
def runs_for(context: JobContext, seconds: float) -> float:
    """Runs for ``seconds``: a job beside another, heartbeaten with it."""
    time.sleep(seconds)
    return seconds


@job(takes_context=True, queue="durable")
def two_approvals(context: JobContext) -> Any:
    return [context.wait_for_signal("approval"), context.wait_for_signal("approval")]


@job(takes_context=True, queue="durable")
def paid(context: JobContext, key: str | None, lookback: float | None = None) -> Any:
    RUNS.append(context.job_id)
    payload = context.wait_for_event(
        "invoice.paid", key=key, timeout=timedelta(days=30), lookback=lookback
    )
    return {"paid": payload}


@job(takes_context=True, queue="durable")
def parks_then_hook(context: JobContext, kind: str) -> Any:
    """A wait whose window between look and park a test fills through HOOK."""
    RUNS.append(context.job_id)
    before = HOOK["before_wait"]
    if before is not None:
        before()
    try:
        if kind == "signal":
            return context.wait_for_signal("approval")
        return context.wait_for_event("invoice.paid", key="42")
    except BaseException:
        after = HOOK["after_look"]
        if after is not None:
            after()
        raise


@job(takes_context=True, queue="durable")
async def async_approval(context: JobContext) -> Any:
    return await context.await_for_signal("approval", timeout=3600)


@job(takes_context=True)
def fault_waits(context: JobContext) -> Any:
    """The fault matrix's waiting job (setup="waits"), of the default queue like the
    matrix's other jobs: takes the signal sent before it, then waits for a signal and
    two events nobody sends or emits (events with a key, without) until their
    half-second timeouts, each a park the wake pass ends."""
    signal = context.wait_for_signal("go", timeout=0.5)
    context.wait_for_signal("fault.none", timeout=0.5)
    keyed = context.wait_for_event("fault.done", key=str(context.job_id), timeout=0.5)
    unkeyed = context.wait_for_event("fault.none", timeout=0.5)
    return [signal, keyed, unkeyed]
