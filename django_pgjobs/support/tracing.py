"""OpenTelemetry: follow a request into the jobs it enqueued.

Optional: needs only ``opentelemetry-api`` (``pip install "django-pgjobs[otel]"``);
the application configures the SDK and exporter as it does for everything else.
Without the package, or while no tracer provider is set, every function here
returns at once and nothing is stored (``trace_context`` stays NULL).

* ``publish``: around an enqueue, a PRODUCER span ``"<task> send"`` (child of
  whatever span is current, e.g. the request's); its W3C trace context
  (``traceparent``/``tracestate``) is what the row stores.
* ``job_span``: around the handler call, a CONSUMER span ``"<task> process"``
  whose parent is the stored context, with the messaging semantic-convention
  attributes and the attempt; an exception leaving the handler is recorded on
  it and sets its status to ERROR. Each attempt is one span, so the retries of
  a job are sibling spans of one trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from django_pgjobs.version import __version__

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # the optional dependency is absent: tracing is off
    trace = None  # type: ignore[assignment]  # mypy types the name as the module

#: ``messaging.system`` of every span.
SYSTEM = "django_pgjobs"

_OFF: AbstractContextManager[Any] = nullcontext(None)
_cache: tuple[Any, Any] = (None, None)  # (tracer provider, its tracer)


def _tracer() -> Any:
    """The package's tracer, or None when OpenTelemetry is absent or not configured."""
    global _cache
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None  # nobody set a provider: spans would go nowhere
    if _cache[0] is not provider:
        _cache = (provider, provider.get_tracer("django_pgjobs", __version__))
    return _cache[1]


def enabled() -> bool:
    """True when spans are being made (OpenTelemetry installed and a provider set)."""
    return _tracer() is not None


class Publish:
    """What ``publish`` yields: the trace context to store, and the send span."""

    def __init__(self, span: Any, carrier: dict[str, str] | None) -> None:
        self.span = span
        self.carrier = carrier

    def set_message_id(self, job_id: int) -> None:
        self.span.set_attribute("messaging.message.id", str(job_id))


def publish(task: str, queue: str, count: int = 1) -> AbstractContextManager[Publish | None]:
    """Around an enqueue of ``count`` jobs: yields a ``Publish`` (None when tracing is off)."""
    tracer = _tracer()
    if tracer is None:
        return _OFF
    return _publish(tracer, task, queue, count)


@contextmanager
def _publish(tracer: Any, task: str, queue: str, count: int) -> Iterator[Publish]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "django_pgjobs.task": task,
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with tracer.start_as_current_span(
        f"{task} send", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Publish(span, carrier or None)


#: ``job_span``'s default: look the tracer up now.
LOOK_UP: Any = object()


def tracer() -> Any:
    """The tracer spans are made with now (None: tracing is off). The worker asks once
    per claim and hands the answer to each of the claim's ``job_span``: asking cost
    about a microsecond a job (OpenTelemetry reads ``os.environ`` while no provider is
    set), a tenth of a no-op job's CPU in the worker."""
    return _tracer()


def job_span(claimed: Any, tracer: Any = LOOK_UP) -> AbstractContextManager[Any]:
    """Around the handler call of one attempt of ``claimed`` (a ``claim.rows.Claimed``);
    ``tracer``: what ``tracer()`` answered for its claim."""
    if tracer is LOOK_UP:
        tracer = _tracer()
    if tracer is None:
        return _OFF
    return _process(tracer, claimed)


@contextmanager
def _process(tracer: Any, claimed: Any) -> Iterator[Any]:
    carrier = getattr(claimed, "trace_context", None)
    # The stored context alone is the parent (not whatever runs the job: a worker
    # thread has none; run_jobs may run inside a test's span).
    try:
        parent = propagate.extract(
            carrier if isinstance(carrier, dict) else {}, context=otel_context.Context()
        )
    except Exception:  # noqa: BLE001 - a trace is never worth failing a job for
        parent = otel_context.Context()
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": claimed.queue,
        "messaging.message.id": str(claimed.id),
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "django_pgjobs.task": claimed.task,
        "django_pgjobs.attempt": claimed.attempt,
        "django_pgjobs.max_attempts": claimed.max_attempts,
    }
    with tracer.start_as_current_span(
        f"{claimed.task} process",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
    ) as span:
        yield span
