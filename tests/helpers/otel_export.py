"""Test-only OpenTelemetry setup: spans of a ``runjobs`` subprocess, as JSON lines in a file.

``tests/settings.py`` calls ``install(path)`` when ``PGJOBS_TEST_OTEL_FILE`` is set,
so a worker started by a test exports every span it ends to that file, where
the test reads them back (the SDK's in-memory exporter only works in-process).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """The parts of a span the tests compare, with ids as hex like traceparent's."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
    }


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock, open(self.path, "a") as fh:
            for span in spans:
                fh.write(json.dumps(span_record(span), default=str) + "\n")
        return SpanExportResult.SUCCESS


def install(path: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)
