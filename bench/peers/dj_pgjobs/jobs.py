"""The benchmark's job: a no-op apart from the harness's latency probe."""

import benchlib

from django_pgjobs import job


@job(name="bench.noop")
def noop(ts: float | None = None) -> None:
    benchlib.handler_body(ts)
