"""OpenTelemetry from a request to a job run by a real ``runjobs`` process, its spans
exported to a file by ``tests/helpers/otel_export.py`` (in-process: tests/db/test_tracing.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_pgjobs.models import Job
from tests.conftest import wait_until
from tests.helpers.tracing import TRACED_TASK, check_trace, records, request_then_enqueue


@pytest.mark.django_db(transaction=True)
@pytest.mark.process
def test_worker_process_span_is_the_enqueues_child_in_the_requests_trace(
    spans: InMemorySpanExporter, tmp_path: Path, start_worker: Callable[..., Any]
) -> None:
    exported = tmp_path / "worker-spans.jsonl"
    job = request_then_enqueue(str(tmp_path / "runs"))
    worker = start_worker(
        "--queues",
        "traced",
        "--concurrency",
        "1",
        "--no-maintenance",
        env={"PGJOBS_TEST_OTEL_FILE": str(exported)},
    )

    def worker_spans() -> list[dict[str, Any]]:
        if not exported.exists():
            return []
        lines = [json.loads(line) for line in exported.read_text().splitlines() if line]
        return [s for s in lines if s["name"] == f"{TRACED_TASK} process"]

    process = wait_until(
        lambda: len(worker_spans()) == 2 and worker_spans(),
        timeout=60,
        message="two process spans from the worker",
    )
    # The span ends when the handler returns; the outcome is written just after.
    wait_until(
        lambda: Job.objects.get(id=job.id).status == "completed",
        message="the job to complete: " + worker.output(),
    )
    got = records(spans)
    [request] = [s for s in got if s["name"] == "POST /orders"]
    [send] = [s for s in got if s["name"] == f"{TRACED_TASK} send"]
    process.sort(key=lambda s: s["attributes"]["django_pgjobs.attempt"])
    check_trace(request, send, process, job)
