"""One trace from a request to every attempt of its job: the spans it must hold,
checked the same in-process and through a real ``runjobs``."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_pgjobs.models import Job
from tests.helpers.otel_export import span_record
from tests.testapp.jobs import traced_fails_once

TRACED_TASK = "tests.testapp.jobs.traced_fails_once"


def records(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [span_record(s) for s in exporter.get_finished_spans()]


def request_then_enqueue(marker: str) -> Job:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /orders", kind=trace.SpanKind.SERVER):
        return traced_fails_once.enqueue(marker)


def check_trace(
    request: dict[str, Any], send: dict[str, Any], process: list[dict[str, Any]], job: Job
) -> None:
    assert send["parent_id"] == request["span_id"], "the enqueue runs inside the request span"
    assert send["kind"] == "PRODUCER" and send["trace_id"] == request["trace_id"]
    assert send["attributes"]["messaging.destination.name"] == "traced"
    assert send["attributes"]["messaging.message.id"] == str(job.id)
    assert len(process) == 2, process
    for attempt, span in enumerate(process, start=1):
        assert span["name"] == f"{TRACED_TASK} process"
        assert span["kind"] == "CONSUMER"
        assert span["trace_id"] == request["trace_id"], "one trace from request to job"
        assert span["parent_id"] == send["span_id"], "the job's span is the enqueue's child"
        assert span["attributes"] == {
            "messaging.system": "django_pgjobs",
            "messaging.destination.name": "traced",
            "messaging.message.id": str(job.id),
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "django_pgjobs.task": TRACED_TASK,
            "django_pgjobs.attempt": attempt,
            "django_pgjobs.max_attempts": 2,
        }
    first, second = process
    assert first["status"] == "ERROR"
    [event] = first["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "RuntimeError"
    assert event["attributes"]["exception.message"] == "first run fails"
    assert second["status"] == "UNSET" and second["events"] == []
    assert first["span_id"] != second["span_id"]
