"""``runjobs --metrics-port`` as a real subprocess, scraped over HTTP.

Runs completing, retried, dead (and, with h-core's timeouts, timed-out) jobs and
checks every metric name and label set of docs/reference/metrics.md with its value.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.helpers.metrics_http import FAST, Samples, free_port, sample_value, scrape
from tests.testapp.jobs import (
    add,
    always_fails,
    flaky_until,
    send_email,
    sleep_then_mark,
    times_out,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

T = "tests.testapp.jobs."


def try_scrape(port: int) -> tuple[Samples, dict[str, str]] | None:
    try:
        return scrape(port)
    except OSError:
        return None


def test_metrics_of_a_worker_process(start_worker: Callable[..., Any], tmp_path: Path) -> None:
    port = free_port()
    for i in range(3):
        add.enqueue(i, i)
    send_email.enqueue("a@example.com")
    always_fails.using(max_attempts=2).enqueue("boom")
    flaky_until.enqueue(str(tmp_path / "flaky"), 2)
    add.using(delay=3600).enqueue(9, 9)  # scheduled: pending, not due
    add.using(queue="parked").enqueue(0, 0)  # no worker serves it: due, lagging
    worker = start_worker(
        "--metrics-port",
        str(port),
        "--queues",
        "default,emails",
        "--concurrency",
        "2",
        "--no-maintenance",
        env=FAST,
    )
    fin = "pgjobs_jobs_finished_total"

    def settled() -> Samples | None:
        got = try_scrape(port)
        if got is None:
            return None
        samples = got[0]
        if (
            sample_value(samples, fin, task=T + "add", queue="default", outcome="completed") == 3
            and sample_value(samples, fin, task=T + "always_fails", queue="default", outcome="dead")
            == 1
            and sample_value(
                samples, fin, task=T + "flaky_until", queue="default", outcome="completed"
            )
            == 1
            and sample_value(samples, "pgjobs_queue_jobs", queue="default", state="due") == 0
            and sample_value(samples, "pgjobs_queue_jobs", queue="default", state="running") == 0
            # the gauges are a snapshot (every 0.2 s here), the counters live: a snapshot
            # from flaky_until's backoff still counts its retry as pending
            and sample_value(samples, "pgjobs_queue_jobs", queue="default", state="pending") == 1
        ):
            return samples
        return None

    samples = wait_until(settled, timeout=60, message="the jobs to finish: " + worker.output())
    _, types = scrape(port)
    assert types["pgjobs_jobs_finished"] == "counter"
    assert types["pgjobs_jobs_claimed"] == "counter"
    assert types["pgjobs_job_duration_seconds"] == "histogram"
    assert types["pgjobs_queue_jobs"] == types["pgjobs_queue_lag_seconds"] == "gauge"
    assert types["pgjobs_worker_inflight"] == "gauge"

    finished = {k[1]: v for k, v in samples.items() if k[0] == fin}
    assert finished == {
        (("outcome", "completed"), ("queue", "default"), ("task", T + "add")): 3,
        (("outcome", "completed"), ("queue", "emails"), ("task", T + "send_email")): 1,
        (("outcome", "retried"), ("queue", "default"), ("task", T + "always_fails")): 1,
        (("outcome", "dead"), ("queue", "default"), ("task", T + "always_fails")): 1,
        (("outcome", "retried"), ("queue", "default"), ("task", T + "flaky_until")): 1,
        (("outcome", "completed"), ("queue", "default"), ("task", T + "flaky_until")): 1,
    }
    claimed = {k[1]: v for k, v in samples.items() if k[0] == "pgjobs_jobs_claimed_total"}
    assert claimed == {(("queue", "default"),): 7, (("queue", "emails"),): 1}
    counts = {k[1]: v for k, v in samples.items() if k[0] == "pgjobs_job_duration_seconds_count"}
    assert counts == {
        (("queue", "default"), ("task", T + "add")): 3,
        (("queue", "emails"), ("task", T + "send_email")): 1,
        (("queue", "default"), ("task", T + "always_fails")): 2,
        (("queue", "default"), ("task", T + "flaky_until")): 2,
    }
    assert (
        sample_value(
            samples,
            "pgjobs_job_duration_seconds_bucket",
            task=T + "add",
            queue="default",
            le="+Inf",
        )
        == 3
    )
    # Queue gauges, from the status query: every declared queue keeps its label (at
    # zero when empty); "parked", which no code or setting names, is folded into "other".
    jobs = {k[1]: v for k, v in samples.items() if k[0] == "pgjobs_queue_jobs"}
    expected_jobs = {}
    for queue, values in {
        "default": (1, 0, 0, 0, 0, 0),
        "emails": (0, 0, 0, 0, 0, 0),
        "other": (1, 1, 0, 0, 0, 0),
    }.items():
        states = ("pending", "due", "running", "stuck", "blocked", "waiting")
        for state, value in zip(states, values, strict=True):
            expected_jobs[(("queue", queue), ("state", state))] = value
    assert {k: v for k, v in jobs.items() if k in expected_jobs} == expected_jobs
    assert not any(v for k, v in jobs.items() if k not in expected_jobs), jobs
    assert not any(dict(k).get("queue") == "parked" for _, k in samples)
    lag = {k[1]: v for k, v in samples.items() if k[0] == "pgjobs_queue_lag_seconds"}
    assert {(("queue", q),) for q in ("default", "emails", "other")} <= set(lag)
    assert lag[(("queue", "default"),)] == lag[(("queue", "emails"),)] == 0
    assert lag[(("queue", "other"),)] > 0
    assert sample_value(samples, "pgjobs_worker_inflight") == 0

    # A job in flight shows in the gauge (and in the queue's running count).
    sleep_then_mark.enqueue(3, str(tmp_path / "slept"))
    wait_until(
        lambda: (
            (s := try_scrape(port))
            and sample_value(s[0], "pgjobs_worker_inflight") == 1
            and sample_value(s[0], "pgjobs_queue_jobs", queue="default", state="running") == 1
        ),
        timeout=30,
        message="the sleeping job in flight",
    )
    done = wait_until(
        lambda: (
            (s := try_scrape(port))
            and sample_value(
                s[0], fin, task=T + "sleep_then_mark", queue="default", outcome="completed"
            )
            == 1
            and s[0]
        ),
        timeout=30,
        message="the sleeping job to complete",
    )
    assert sample_value(done, "pgjobs_worker_inflight") == 0
    assert (
        sample_value(
            done, "pgjobs_job_duration_seconds_sum", task=T + "sleep_then_mark", queue="default"
        )
        >= 3
    )
    assert sample_value(done, "pgjobs_jobs_claimed_total", queue="default") == 8
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


def test_timed_out_jobs_are_counted(start_worker: Callable[..., Any]) -> None:
    port = free_port()
    times_out.enqueue(5)
    worker = start_worker(
        "--metrics-port", str(port), "--concurrency", "1", "--no-maintenance", env=FAST
    )
    samples = wait_until(
        lambda: (
            (s := try_scrape(port))
            and sample_value(
                s[0],
                "pgjobs_jobs_finished_total",
                task=T + "times_out",
                queue="default",
                outcome="timed_out",
            )
            == 1
            and s[0]
        ),
        timeout=60,
        message="the timeout to be counted",
    )
    for outcome in ("retried", "dead", "completed"):
        assert (
            sample_value(
                samples,
                "pgjobs_jobs_finished_total",
                task=T + "times_out",
                queue="default",
                outcome=outcome,
            )
            is None
        ), outcome
    worker.signal(signal.SIGTERM)
    worker.wait(30)


def test_port_zero_from_the_setting_prints_the_chosen_port(
    start_worker: Callable[..., Any],
) -> None:
    """Several workers on one host: each binds its own port; 0 picks a free one and
    prints it. PGJOBS["METRICS_PORT"] applies when the option is not given."""
    add.enqueue(1, 1)
    first = start_worker("--no-maintenance", env={**FAST, "PGJOBS_TEST_METRICS_PORT": "0"})
    second = start_worker("--no-maintenance", env={**FAST, "PGJOBS_TEST_METRICS_PORT": "0"})
    ports = []
    for worker in (first, second):
        found = wait_until(
            lambda w=worker: re.search(
                r"serving Prometheus metrics at http://127\.0\.0\.1:(\d+)/metrics", w.output()
            ),
            timeout=30,
            message="the metrics line",
        )
        ports.append(int(found.group(1)))
    assert ports[0] != ports[1] and 0 not in ports
    totals = wait_until(
        lambda: (
            all(try_scrape(p) for p in ports)
            and sum(
                sample_value(
                    scrape(p)[0],
                    "pgjobs_jobs_finished_total",
                    task=T + "add",
                    queue="default",
                    outcome="completed",
                )
                or 0
                for p in ports
            )
        ),
        message="the job in one worker's counter",
    )
    assert totals == 1
    # A worker asking for a port already taken exits with a clear error.
    add.enqueue(2, 2)
    clash = start_worker("--metrics-port", str(ports[0]), "--no-maintenance")
    assert clash.wait(30) != 0
    assert f"--metrics-port {ports[0]}: cannot listen" in clash.output()
    for worker in (first, second):
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
