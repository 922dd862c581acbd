"""The benchmark's job: a no-op apart from the harness's latency probe."""

import benchlib

from django_pgjobs import job


@job(name="bench.noop")
def noop(ts: float | None = None) -> None:
    benchlib.handler_body(ts)


@job(name="bench.io_sync")
def io_sync() -> None:
    benchlib.io_job_sync()


@job(name="bench.io_async")
async def io_async() -> None:
    await benchlib.io_job_async()
