"""OpenTelemetry from request to job, with the SDK's exporters.

A "request" span encloses the enqueue; the enqueue's send span is its child and
its context is stored on the row; each attempt of the job runs in a
``"<task> process"`` span whose parent is that send span: one trace from the
request to every retry. Checked through ``testing.run_jobs()`` (in-memory
exporter); through a real ``runjobs`` subprocess in
tests/process/test_tracing_process.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import django
import pytest
from django.db import connection
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_pgjobs.db.tables import JOB
from django_pgjobs.models import Job
from django_pgjobs.support import tracing
from django_pgjobs.testing import run_jobs
from tests.conftest import reset_tracer_provider, wait_until
from tests.helpers.tracing import TRACED_TASK, check_trace, records, request_then_enqueue
from tests.testapp.jobs import add


def _stored_context(job: Job) -> dict[str, str] | None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT trace_context FROM {JOB} WHERE id = %s", [job.id])
        value = cursor.fetchone()[0]
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.django_db(transaction=True)  # now() moves on, so the retry comes due
def test_run_jobs_span_is_the_enqueues_child_in_the_requests_trace(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    job = request_then_enqueue(str(tmp_path / "runs"))
    stored = _stored_context(job)
    assert stored is not None and set(stored) >= {"traceparent"}
    assert job.trace_context == stored
    statuses: list[str] = []
    # The first attempt fails; the retry runs once its backoff (<= 0.2 s) has passed.
    wait_until(
        lambda: statuses.extend(r.status for r in run_jobs()) or "completed" in statuses,
        message="the retry to come due and run",
    )
    assert statuses == ["pending", "completed"]
    job.refresh_from_db()
    assert job.status == "completed" and job.attempts == 2
    got = records(spans)
    [request] = [s for s in got if s["name"] == "POST /orders"]
    [send] = [s for s in got if s["name"] == f"{TRACED_TASK} send"]
    process = [s for s in got if s["name"] == f"{TRACED_TASK} process"]
    assert request["parent_id"] is None
    assert stored["traceparent"].startswith(f"00-{send['trace_id']}-{send['span_id']}-")
    check_trace(request, send, process, job)


@pytest.mark.django_db(transaction=True)  # rows' run_at default is statement_timestamp()
def test_every_enqueue_path_stores_the_context(spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as request:
        trace_id = f"{request.get_span_context().trace_id:032x}"
        one = add.enqueue(1, 2)
        by_name = Job.objects.enqueue("tests.testapp.jobs.add", args=[3, 4])
        assert add.enqueue_many([(5, 6), (7, 8)]) == 2
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgjobs_enqueue('tests.testapp.jobs.add', '[1, 1]'::jsonb)")
        from_sql = cursor.fetchone()[0]
    many = list(Job.objects.exclude(id__in=[one.id, by_name.id, from_sql]))
    assert len(many) == 2
    for job in (one, by_name, *many):
        stored = _stored_context(job)
        assert stored is not None and stored["traceparent"].split("-")[1] == trace_id, job.id
    assert _stored_context(many[0]) == _stored_context(many[1]), "one send span per batch"
    assert _stored_context(Job.objects.get(id=from_sql)) is None, "SQL enqueues carry none"
    sends = [s for s in records(spans) if s["name"].endswith(" send")]
    assert len(sends) == 3
    assert [s["attributes"].get("messaging.batch.message_count") for s in sends] == [None, None, 2]
    # Each job's span in run_jobs has its own enqueue's send span as parent.
    run_jobs()
    parents = {
        s["attributes"]["messaging.message.id"]: s["parent_id"]
        for s in records(spans)
        if s["name"].endswith(" process")
    }
    assert parents[str(one.id)] == sends[0]["span_id"]
    assert parents[str(by_name.id)] == sends[1]["span_id"]
    assert {parents[str(j.id)] for j in many} == {sends[2]["span_id"]}
    assert parents[str(from_sql)] is None, "no stored context: a root span"


@pytest.mark.django_db
def test_no_tracer_provider_means_no_spans_and_nothing_stored() -> None:
    reset_tracer_provider()
    assert not tracing.enabled()
    assert tracing.publish("t", "q") is tracing.job_span(object()) is tracing._OFF
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request"):
        job = add.enqueue(1, 2)
    assert _stored_context(job) is None and job.trace_context is None
    assert [r.status for r in run_jobs()] == ["completed"]


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks needs Django 6")
@pytest.mark.django_db
def test_tasks_backend_enqueue_stores_the_context(spans: InMemorySpanExporter) -> None:
    from tests.tasks_backend.tasks import echo

    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as request:
        trace_id = f"{request.get_span_context().trace_id:032x}"
        result = echo.enqueue(1, word="x")
    stored = _stored_context(Job.objects.get(id=int(result.id)))
    assert stored is not None and stored["traceparent"].split("-")[1] == trace_id


@pytest.mark.django_db(transaction=True)
def test_async_job_and_aenqueue_spans(spans: InMemorySpanExporter) -> None:
    """``await job.aenqueue()`` inside a request span, then an ``async def`` job on a
    real worker's event loop: its span is the enqueue's child."""
    import asyncio
    import threading

    from django_pgjobs.worker.loop import Worker
    from tests.testapp.core_jobs import async_sleep

    tracer = trace.get_tracer("tests")

    async def request() -> Job:
        from asgiref.sync import sync_to_async
        from django.db import connections

        with tracer.start_as_current_span("GET /report"):
            job = await async_sleep.aenqueue(0.01)
        await sync_to_async(connections.close_all)()  # the ORM thread's connection
        return job

    job = asyncio.run(request())
    worker = Worker(burst=True, maintenance=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    job.refresh_from_db()
    assert job.status == "completed"
    got = records(spans)
    [req] = [s for s in got if s["name"] == "GET /report"]
    [send] = [s for s in got if s["name"] == f"{async_sleep.name} send"]
    [process] = [s for s in got if s["name"] == f"{async_sleep.name} process"]
    assert send["parent_id"] == req["span_id"]
    assert process["parent_id"] == send["span_id"] and process["trace_id"] == req["trace_id"]
    assert process["attributes"]["messaging.message.id"] == str(job.id)


@pytest.mark.parametrize(
    "stored",
    [
        "'{\"traceparent\": 5}'::jsonb",
        '\'{"traceparent": ["00-x"], "tracestate": {"a": 1}}\'::jsonb',
        "'[1, 2]'::jsonb",
        "'\"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"'::jsonb",
        "(repeat('[', 3000) || repeat(']', 3000))::jsonb",
        "'{\"traceparent\": 1e5000}'::jsonb",
    ],
)
@pytest.mark.django_db
def test_a_hostile_stored_trace_context_never_fails_the_job(
    spans: InMemorySpanExporter, stored: str
) -> None:
    """``{"traceparent": 5}`` makes the propagator raise TypeError. A trace is never
    worth failing a job for: the job runs, in a span of a trace of its own."""
    job = add.enqueue(2, 3)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {JOB} SET trace_context = {stored} WHERE id = %s", [job.id])
    ran = run_jobs()
    assert [(r.id, r.status) for r in ran] == [(job.id, "completed")]
    process = [r for r in records(spans) if r["name"].endswith(" process")]
    assert len(process) == 1 and process[0]["parent_id"] is None, process
