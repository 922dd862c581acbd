"""What the model's workers run (PGJOBS["JOB_MODULES"], loaded by workers started
with PGJOBS_TEST_MODEL=1 and by the test process). Every job records its runs
(``records``); none fails by its own code except the kinds at the end, which
misbehave on purpose (a crash, a long C call holding the GIL, a stopped loop, a
cancel of every task of the loop).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time

from django_pgjobs import ChunkItem, JobContext, job
from tests.model import records

PLAIN, KEYED, CAPPED, ASYNC = "model", "model-keyed", "model-capped", "model-async"
#: max_running of the capped queue (its Queue row is made by each scenario)
CAP = 2
#: the default max_attempts; the few SIGKILLs and freezes of one scenario
#: (plan.MAX_LOSSES) never use it up
ATTEMPTS = 5


def _run(context: JobContext, kind: str, key: str | None, seconds: float) -> None:
    run = records.start(context, kind, key)
    time.sleep(seconds)  # ignores cancellation, like a long C call that releases the GIL
    records.end(run, True)


@job(queue=PLAIN, takes_context=True, max_attempts=ATTEMPTS)
def plain(context: JobContext, tag: int, seconds: float) -> int:
    _run(context, "plain", None, seconds)
    return tag


@job(
    queue=KEYED,
    takes_context=True,
    concurrency_key="model:{key}",
    concurrency_limit=1,
    max_attempts=ATTEMPTS,
)
def keyed(context: JobContext, tag: int, seconds: float, key: str) -> int:
    _run(context, "keyed", f"model:{key}", seconds)
    return tag


@job(queue=CAPPED, takes_context=True, max_attempts=ATTEMPTS)
def capped(context: JobContext, tag: int, seconds: float) -> int:
    _run(context, "capped", "capped", seconds)
    return tag


@job(queue=PLAIN, takes_context=True, chunk=3, chunk_wait=0.2, max_attempts=ATTEMPTS)
def chunk(items: list[ChunkItem]) -> dict[int, int]:
    """A chunk handler: one call for up to three jobs, each recorded as a run of its
    own (its own context), the call as long as its longest item; each job's result
    is its tag."""
    runs = [records.start(item.context, "chunk", None) for item in items]
    time.sleep(max(float(item.args[1]) for item in items))
    for run in runs:
        records.end(run, True)
    return {item.job_id: item.args[0] for item in items}


@job(
    queue=PLAIN,
    takes_context=True,
    debounce=0.3,
    debounce_key="model-debounce:{key}",
    max_wait=1.0,
    max_attempts=ATTEMPTS,
)
def debounce(context: JobContext, tag: int, seconds: float, key: str) -> int:
    """Debounced, keeping the latest arguments: its result is the tag of the last
    enqueue that joined it while it was pending."""
    _run(context, "debounce", None, seconds)
    return tag


@job(
    queue=PLAIN,
    takes_context=True,
    debounce=0.3,
    debounce_key="model-debounce:{key}",
    max_wait=1.0,
    keep="first",
    max_attempts=ATTEMPTS,
)
def debouncefirst(context: JobContext, tag: int, seconds: float, key: str) -> int:
    """Debounced, keeping the first arguments: its result is the tag of the enqueue
    that made it."""
    _run(context, "debouncefirst", None, seconds)
    return tag


@job(queue=CAPPED, takes_context=True, fair_key="model-fair:{tenant}", max_attempts=ATTEMPTS)
def fair(context: JobContext, tag: int, seconds: float, tenant: str) -> int:
    """A tenant's job on the capped queue, which its fair key makes a fair queue: the
    capped kinds' jobs take their turn there as the key ``""``, under one max_running."""
    _run(context, "fair", "capped", seconds)
    return tag


@job(
    queue=KEYED,
    takes_context=True,
    fair_key="model-fair:{tenant}",
    concurrency_key="model:{key}",
    concurrency_limit=1,
    max_attempts=ATTEMPTS,
)
def fairkeyed(context: JobContext, tag: int, seconds: float, key: str, tenant: str) -> int:
    """A tenant's job on the keyed queue (a fair queue through it), sharing the keyed
    kind's concurrency keys: a tenant whose next job waits on a busy key is passed over."""
    _run(context, "fairkeyed", f"model:{key}", seconds)
    return tag


@job(queue=PLAIN, takes_context=True, unique_while="active", max_attempts=ATTEMPTS)
def unique(context: JobContext, tag: int, seconds: float) -> int:
    _run(context, "unique", None, seconds)
    return tag


async def _arun(context: JobContext, kind: str, key: str | None, block: float, wait: float) -> None:
    # The start is written in a thread that a cancel does not stop: a timeout that
    # cancelled the task while it was written left a run started and never ended. So it
    # is awaited shielded, in the try. Both writes are executor futures, not tasks: a
    # neighbour cancelling every task of the loop (``acancel``) cannot reach them.
    loop = asyncio.get_running_loop()
    starting = loop.run_in_executor(None, records.start, context, kind, key)
    finished = False
    try:
        await asyncio.shield(starting)
        time.sleep(block)  # blocks the event loop (a misbehaving but legal job)
        await asyncio.sleep(wait)
        finished = True
    finally:
        # Cancelled (a timeout, a cancel, a neighbour): the run ends here, with the task.
        run = await asyncio.shield(starting)
        ending = loop.run_in_executor(None, records.end, run, finished)
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            # Cancelled while the end was written: the task did not return after all,
            # and the queue gives the run back. The record says so once it is written.
            ending.add_done_callback(lambda _: loop.run_in_executor(None, records.end, run, False))
            raise


@job(queue=ASYNC, takes_context=True, max_attempts=ATTEMPTS)
async def aplain(context: JobContext, tag: int, seconds: float) -> int:
    await _arun(context, "aplain", None, 0.0, seconds)
    return tag


@job(queue=CAPPED, takes_context=True, max_attempts=ATTEMPTS)
async def acapped(context: JobContext, tag: int, seconds: float) -> int:
    await _arun(context, "acapped", "capped", 0.0, seconds)
    return tag


@job(queue=ASYNC, takes_context=True, max_attempts=ATTEMPTS)
async def ablock(context: JobContext, tag: int, seconds: float) -> int:
    """Blocks the loop for ``seconds`` with a plain sleep before returning."""
    await _arun(context, "ablock", None, seconds, 0.0)
    return tag


# -- the misbehaving kinds (plan.BROKEN_KIND: out of the mix while in KNOWN_BROKEN) ------


@job(queue=PLAIN, takes_context=True, max_attempts=ATTEMPTS)
def crash(context: JobContext, tag: int) -> int:
    """Kills its own process (os._exit): it is charged for it, its neighbours are not."""
    records.start(context, "crash", None)
    time.sleep(0.3)  # let neighbours be mid-run
    os._exit(1)


def _catastrophic(length: int) -> None:
    re.match(r"(a+)+$", "a" * length + "b")  # exponential backtracking, all in C


def _length_for(seconds: float) -> int:
    """The input length that keeps the regex engine busy about ``seconds`` here."""
    start = time.perf_counter()
    _catastrophic(18)
    took = max(time.perf_counter() - start, 1e-4)
    return 18 + max(0, math.ceil(math.log(seconds / took, 1.9)))


@job(queue=PLAIN, takes_context=True, max_attempts=ATTEMPTS)
def gil(context: JobContext, tag: int, seconds: float) -> int:
    """One long C call that never releases the GIL (longer than STALE_AFTER)."""
    run = records.start(context, "gil", None)
    _catastrophic(_length_for(seconds))
    records.end(run, True)
    return tag


@job(queue=ASYNC, takes_context=True, max_attempts=ATTEMPTS)
async def aloop(context: JobContext, tag: int) -> int:
    """Stops the event loop it runs on, then goes on as if nothing happened."""
    run = await asyncio.to_thread(records.start, context, "aloop", None)
    asyncio.get_running_loop().stop()
    await asyncio.sleep(0.1)
    await asyncio.to_thread(records.end, run, True)
    return tag


@job(queue=PLAIN, max_attempts=ATTEMPTS)
def tally(counts: dict[str, int]) -> dict[str, int]:
    """A batch's callback (tests/model/batches.py): returns what the batch counted."""
    return counts


@job(queue=ASYNC, takes_context=True, max_attempts=1)
async def acancel(context: JobContext, tag: int) -> int:
    """Cancels every task of the event loop it runs on, its own too: its neighbours are
    given back uncharged and run again; it is charged (dead, one attempt)."""
    loop = asyncio.get_running_loop()
    run = await loop.run_in_executor(None, records.start, context, "acancel", None)
    try:
        for task in asyncio.all_tasks():
            task.cancel()
        await asyncio.sleep(0.1)
    finally:
        await asyncio.shield(loop.run_in_executor(None, records.end, run, False))
    return tag
