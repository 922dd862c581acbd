"""Jobs of the flow-control tests (imported through PGJOBS["JOB_MODULES"], not an
app's ``jobs`` module). Each returns its own start and end time (time.time(): all
workers run on this host), so a test reads overlaps from the stored results."""

from __future__ import annotations

import time
from datetime import timedelta

from django_pgjobs import JobContext, job
from tests.helpers import run_records


def timed(seconds: float) -> dict[str, float]:
    start = time.time()
    time.sleep(seconds)
    return {"start": start, "end": time.time()}


@job(queue="flow-limited")
def limited(i: int, seconds: float) -> dict[str, float]:
    return timed(seconds)


@job(queue="flow-rated")
def rated(i: int) -> dict[str, float]:
    return timed(0)


@job(queue="flow-held")
def held(i: int) -> dict[str, float]:
    return timed(0.05)


@job(queue="flow-flowing")
def flowing(i: int) -> dict[str, float]:
    return timed(0.05)


@job(unique_while="active")
def refresh_account(account_id: int) -> None:
    return None


@job(unique_while="pending", queue="flow-unique")
def rebuild_index(name: str, seconds: float = 0.0) -> dict[str, float]:
    return timed(seconds)


@job(queue="flow-deploy")
def new_in_this_release(i: int) -> dict[str, float]:
    """Unknown to a worker started with PGJOBS_TEST_OLD_WORKER=1."""
    return timed(0.01)


@job(queue="slots-capped", takes_context=True)
def capped_sleeper(context: JobContext, seconds: float) -> None:
    """The queue gets max_running in the test; records its runs (tests/helpers/run_records.py)."""
    run_records.recorded(context, "slots-capped", seconds)


@job(
    queue="flow-debounce",
    debounce=timedelta(seconds=5),
    debounce_key="reindex:{doc_id}",
    max_wait=timedelta(minutes=1),
)
def reindex(doc_id: int, version: int = 0) -> dict[str, int]:
    """Debounced, keeps the latest arguments: returns the ones it ran with."""
    return {"doc_id": doc_id, "version": version}


@job(queue="flow-debounce", debounce=0.2, debounce_key="{doc_id}", keep="first")
def reindex_first(doc_id: int, version: int = 0) -> dict[str, int]:
    """Debounced, keeps the first arguments."""
    return {"doc_id": doc_id, "version": version}


@job(queue="flow-debounce", debounce=0.2, debounce_key="{doc_id}")
def reindex_soon(doc_id: int, version: int = 0) -> dict[str, int]:
    """Debounced briefly, keeps the latest arguments (no max_wait)."""
    return {"doc_id": doc_id, "version": version}
