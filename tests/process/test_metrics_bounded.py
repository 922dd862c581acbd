"""``/metrics`` stays small however many queue names jobs use, and listens where it
is told (``--metrics-address``, ``PGJOBS["METRICS_ADDRESS"]``; default 127.0.0.1).
Real ``runjobs`` subprocesses, scraped over HTTP."""

from __future__ import annotations

import re
import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from prometheus_client.parser import text_string_to_metric_families

from django_pgjobs.conf import settings_errors
from django_pgjobs.models import Queue
from django_pgjobs.queues import declared_queues
from tests.conftest import WorkerProcess, wait_until
from tests.helpers.metrics_http import FAST, free_port
from tests.testapp.jobs import add

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ADD = "tests.testapp.jobs.add"
FLOOD = 1500


def scrape_text(port: int) -> str | None:
    try:
        return (
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        )
    except OSError:
        return None


def queue_labels(text: str) -> dict[str, set[str]]:
    """{metric family: the queue label values it reports}."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "queue" in sample.labels:
                out.setdefault(family.name, set()).add(sample.labels["queue"])
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_a_flood_of_queue_names_folds_into_other(
    start_worker: Callable[..., WorkerProcess], capsys: Any
) -> None:
    Queue.objects.create(name="kept-by-table")  # a row: keeps its own label
    with transaction.atomic():
        for i in range(FLOOD):
            add.using(queue=f"adhoc-{i}").enqueue(i, i)
        add.using(queue="kept-by-table").enqueue(1, 2)
    port = free_port()
    worker = start_worker(
        "--metrics-port", str(port), "--concurrency", "4", "--no-maintenance", env=FAST
    )
    finished = "pgjobs_jobs_finished_total"

    def settled() -> str | None:
        text = scrape_text(port)
        if (
            text
            and value(text, finished, task=ADD, queue="other", outcome="completed") == FLOOD
            and value(text, finished, task=ADD, queue="kept-by-table", outcome="completed") == 1
            and value(text, "pgjobs_queue_jobs", queue="other", state="pending") == 0
        ):
            return text
        return None

    text = wait_until(settled, timeout=240, interval=0.5, message="the flood: " + worker.output())
    allowed = declared_queues() | {"kept-by-table", "other"}
    for family, labels in queue_labels(text).items():
        assert labels <= allowed, (family, sorted(labels - allowed)[:5])
    assert "adhoc-" not in text
    assert value(text, "pgjobs_jobs_claimed_total", queue="other") == FLOOD
    assert value(text, "pgjobs_job_duration_seconds_count", task=ADD, queue="other") == FLOOD
    size = len(text.encode())
    with capsys.disabled():
        print(f"\n/metrics after {FLOOD + 1} jobs in {FLOOD + 1} queues: {size} bytes")
    assert size < 64 * 1024, size
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


def listening_address(port: int) -> str | None:
    """The local address a socket LISTENs on at ``port`` (from /proc/net/tcp*)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                if len(address) == 8:
                    return ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
                return "::" if set(address) == {"0"} else address
    return None


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, "127.0.0.1"),
        (("--metrics-address", "0.0.0.0"), {}, "0.0.0.0"),  # noqa: S104 - what it asks for
        ((), {"PGJOBS_TEST_METRICS_ADDRESS": "0.0.0.0"}, "0.0.0.0"),  # noqa: S104
    ],
)
def test_metrics_listen_where_told(
    start_worker: Callable[..., WorkerProcess],
    args: tuple[str, ...],
    env: dict[str, str],
    expected: str,
) -> None:
    port = free_port()
    worker = start_worker(
        "--metrics-port", str(port), *args, "--no-maintenance", env={**FAST, **env}
    )
    wait_until(
        lambda: (
            f"serving Prometheus metrics at http://{expected}:{port}/metrics" in worker.output()
        ),
        timeout=60,
        message="the metrics line: " + worker.output(),
    )
    assert listening_address(port) == expected
    assert scrape_text(port) is not None
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


def test_a_bad_metrics_address_is_a_clear_error() -> None:
    with pytest.raises(CommandError, match=r"--metrics-address: must be an address to listen on"):
        call_command("runjobs", "--metrics-address", "not an address", "--metrics-port", "0")
    with pytest.raises(
        CommandError, match=r"--metrics-port \d+: cannot listen on it at 192\.0\.2\.1"
    ):
        call_command("runjobs", "--metrics-address", "192.0.2.1", "--metrics-port", "0", "--burst")
    [error] = settings_errors({"METRICS_ADDRESS": "::1 and more"})
    assert str(error).startswith("PGJOBS['METRICS_ADDRESS'] must be an address to listen on")
    assert not re.search(r"\bTraceback\b", str(error))
