"""Prometheus metrics in-process: the signal receivers, the queue refresher, bad input.

The end-to-end check (a real ``runjobs --metrics-port`` subprocess scraped over
HTTP) is ``tests/process/test_metrics_process.py``.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_pgjobs import claim
from django_pgjobs.db.job_admin import job_cancel
from django_pgjobs.db.job_outcome import job_complete_many
from django_pgjobs.exceptions import LeaseLost
from django_pgjobs.health import metrics
from django_pgjobs.health.metrics import WorkerMetrics
from django_pgjobs.health.queue_stats import QueueStatsRefresher
from django_pgjobs.testing import run_jobs
from django_pgjobs.worker.loop import Worker
from tests.conftest import wait_until
from tests.testapp.jobs import add, always_fails, atomic_insert, send_email, sleep_then_mark

TASK = "tests.testapp.jobs."


@pytest.fixture
def wm() -> Iterator[WorkerMetrics]:
    m = WorkerMetrics(process_metrics=False).connect()
    yield m
    m.close()


def value(m: WorkerMetrics, name: str, **labels: str) -> float:
    got = m.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


@pytest.mark.django_db
def test_run_jobs_feeds_finished_counters_and_durations(wm: WorkerMetrics) -> None:
    add.enqueue(1, 2)
    add.enqueue(3, 4)
    send_email.enqueue("a@example.com")
    always_fails.using(max_attempts=2).enqueue("x")
    always_fails.using(max_attempts=1, queue="billing").enqueue("y")
    ran = run_jobs()
    assert len(ran) == 5  # the retried job's backoff has not passed yet
    fin = "pgjobs_jobs_finished_total"
    assert value(wm, fin, task=TASK + "add", queue="default", outcome="completed") == 2
    assert value(wm, fin, task=TASK + "send_email", queue="emails", outcome="completed") == 1
    assert value(wm, fin, task=TASK + "always_fails", queue="default", outcome="retried") == 1
    assert value(wm, fin, task=TASK + "always_fails", queue="billing", outcome="dead") == 1
    dur = "pgjobs_job_duration_seconds_count"
    assert value(wm, dur, task=TASK + "add", queue="default") == 2
    assert value(wm, dur, task=TASK + "always_fails", queue="billing") == 1
    assert 0 < value(wm, "pgjobs_job_duration_seconds_sum", task=TASK + "add", queue="default") < 5
    assert value(wm, "pgjobs_worker_inflight") == 0
    # run_jobs claims without jobs_claimed (it is not a worker): no claimed counts.
    assert value(wm, "pgjobs_jobs_claimed_total", queue="default") == 0


@pytest.mark.django_db(transaction=True)
def test_worker_feeds_claimed_inflight_and_released(wm: WorkerMetrics, tmp_path: Path) -> None:
    marker = str(tmp_path / "ran")
    add.enqueue(1, 1)
    long = sleep_then_mark.enqueue(30, marker)
    worker = Worker(maintenance=False, concurrency=2, poll_interval=0.1, shutdown_timeout=0.5)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: (
                value(
                    wm,
                    "pgjobs_jobs_finished_total",
                    task=TASK + "add",
                    queue="default",
                    outcome="completed",
                )
                == 1
            ),
            message="the quick job to complete",
        )
        wait_until(
            lambda: value(wm, "pgjobs_worker_inflight") == 1,
            message="the long job to be the one in flight",
        )
        assert value(wm, "pgjobs_jobs_claimed_total", queue="default") == 2
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert (
        value(
            wm,
            "pgjobs_jobs_finished_total",
            task=TASK + "sleep_then_mark",
            queue="default",
            outcome="released",
        )
        == 1
    )
    # A released job was not a finished run: no duration for it.
    assert (
        value(
            wm, "pgjobs_job_duration_seconds_count", task=TASK + "sleep_then_mark", queue="default"
        )
        == 0
    )
    assert value(wm, "pgjobs_worker_inflight") == 0
    long.refresh_from_db()
    assert long.status == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_fenced_completion_counts_as_fenced_once(wm: WorkerMetrics) -> None:
    """An atomic job whose lease moved on while it ran: its write is fenced."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS obs_atomic (job_id bigint, lease bigint)")
    job = atomic_insert.enqueue("obs_atomic", 0.0)
    [claimed] = claim.claim(connection, worker="zombie", queues=["default"], n=1)
    job_cancel(connection, [job.id])  # someone else moved the lease on
    from django_pgjobs import signals
    from django_pgjobs.worker import outcomes
    from django_pgjobs.worker.executor import execute

    signals.send(
        signals.job_started,
        job_id=claimed.id,
        task=claimed.task,
        queue=claimed.queue,
        attempt=claimed.attempt,
        lease=claimed.lease,
        worker="zombie",
    )
    outcome = execute(claimed, worker="zombie", alias="default")
    assert outcome.kind == "fenced" and isinstance(outcome.exception, LeaseLost)
    outcomes.report_fenced(claimed, "heartbeat", worker="zombie")  # notice only
    outcomes.report(
        claimed, outcome, ours=outcomes.write(connection, claimed, outcome), worker="zombie"
    )
    assert (
        value(
            wm,
            "pgjobs_jobs_finished_total",
            task=TASK + "atomic_insert",
            queue="default",
            outcome="fenced",
        )
        == 1
    )
    assert (
        value(wm, "pgjobs_job_duration_seconds_count", task=TASK + "atomic_insert", queue="default")
        == 1
    )
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE obs_atomic")


@pytest.mark.django_db
def test_a_timeout_reported_twice_is_counted_once(wm: WorkerMetrics) -> None:
    """A run that timed out is counted as timed_out once, whether the worker sends
    job_timed_out, a failure whose exception is JobTimeout, or both."""
    from django_pgjobs import signals

    class JobTimeout(Exception):  # stands for django_pgjobs.JobTimeout (h-core)
        pass

    base = {"task": TASK + "add", "queue": "default", "attempt": 1, "worker": "w"}
    signals.send(signals.job_started, job_id=1, lease=1, **base)
    signals.send(signals.job_timed_out, job_id=1, lease=1, retry_in=0.5, **base)
    signals.send(
        signals.job_failed, job_id=1, lease=1, exception=JobTimeout("late"), retry_in=0.5, **base
    )
    signals.send(signals.job_dead, job_id=2, lease=1, exception=JobTimeout("late"), **base)
    fin = {"task": TASK + "add", "queue": "default"}
    assert value(wm, "pgjobs_jobs_finished_total", outcome="timed_out", **fin) == 2
    assert value(wm, "pgjobs_jobs_finished_total", outcome="retried", **fin) == 0
    assert value(wm, "pgjobs_jobs_finished_total", outcome="dead", **fin) == 0
    assert value(wm, "pgjobs_job_duration_seconds_count", **fin) == 1  # job 2 never started here


@pytest.mark.django_db(transaction=True)
def test_refresher_reads_queue_gauges_from_the_status_query(wm: WorkerMetrics) -> None:
    add.enqueue(1, 1)
    add.using(delay=3600).enqueue(2, 2)
    send_email.enqueue("b@example.com")
    [running] = claim.claim(connection, worker="w", queues=["emails"], n=1)
    refresher = QueueStatsRefresher(wm.queues, queues=["reports"], interval=0.05)
    refresher.start()
    try:
        wait_until(refresher.refreshed.is_set, message="a first refresh")
        jobs = "pgjobs_queue_jobs"
        assert value(wm, jobs, queue="default", state="pending") == 2
        assert value(wm, jobs, queue="default", state="due") == 1
        assert value(wm, jobs, queue="default", state="running") == 0
        assert value(wm, jobs, queue="emails", state="running") == 1
        assert value(wm, jobs, queue="emails", state="pending") == 0
        # A queue this worker serves is reported (at zero) even when empty.
        assert wm.registry.get_sample_value(jobs, {"queue": "reports", "state": "pending"}) == 0
        assert value(wm, "pgjobs_queue_lag_seconds", queue="default") > 0
        assert value(wm, "pgjobs_queue_lag_seconds", queue="emails") == 0
        # Work finishing empties the gauges on a later refresh; the queue stays, at zero.
        run_jobs(queues=["default"])
        job_complete_many(connection, [(running.id, running.lease, None)])
        wait_until(
            lambda: (
                value(wm, jobs, queue="emails", state="running") == 0
                and value(wm, jobs, queue="default", state="due") == 0
            ),
            message="the gauges to follow the table",
        )
        assert value(wm, jobs, queue="default", state="pending") == 1  # the scheduled one
        assert value(wm, "pgjobs_queue_lag_seconds", queue="default") == 0
        assert wm.registry.get_sample_value(jobs, {"queue": "emails", "state": "running"}) == 0
    finally:
        refresher.stop()


@pytest.mark.django_db
def test_a_scrape_runs_no_query(wm: WorkerMetrics) -> None:
    from django.test.utils import CaptureQueriesContext
    from prometheus_client import generate_latest

    add.enqueue(1, 1)
    with CaptureQueriesContext(connection) as queries:
        text = generate_latest(wm.registry).decode()
    assert "pgjobs_queue_jobs" in text and "pgjobs_worker_inflight 0.0" in text
    assert queries.captured_queries == []


def _busy_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))  # noqa: S104 - taken on every interface, as the server binds
    sock.listen(1)
    return sock, sock.getsockname()[1]


@pytest.mark.django_db
def test_bad_metrics_port_is_a_clear_error_naming_the_option() -> None:
    with pytest.raises(CommandError, match=r"--metrics-port.*0-65535.*got 70000"):
        call_command("runjobs", "--metrics-port", "70000")
    with pytest.raises(CommandError, match=r"--metrics-port.*port number"):
        call_command("runjobs", "--metrics-port", "http")
    sock, port = _busy_port()
    try:
        with pytest.raises(CommandError, match=f"--metrics-port {port}: cannot listen"):
            call_command("runjobs", "--metrics-port", str(port), "--burst")
    finally:
        sock.close()
    assert metrics._active is None


@pytest.mark.django_db
def test_metrics_without_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import django_pgjobs.health

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    # Forget the module wherever an earlier test in this process imported it (the
    # order differs under xdist): sys.modules and the package's attribute, which
    # `from django_pgjobs.health import metrics` would otherwise return as is.
    monkeypatch.delitem(sys.modules, "django_pgjobs.health.metrics", raising=False)
    monkeypatch.delattr(django_pgjobs.health, "metrics", raising=False)
    job = add.enqueue(1, 1)
    with pytest.raises(CommandError, match=r"prometheus_client.*django-pgjobs\[metrics\]"):
        call_command("runjobs", "--metrics-port", "0", "--burst")
    job.refresh_from_db()
    assert job.status == "pending" and job.attempts == 0  # nothing was claimed
