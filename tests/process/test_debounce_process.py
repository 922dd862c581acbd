"""Debounce against a real ``runjobs`` worker that claims while the enqueues arrive:
a thousand enqueues of one key from eight threads, the worker free to start the job
between any two of them. Whatever it started, each job ran once with the arguments it
holds (an enqueue never rewrote a running job), and the last enqueue's arguments ran."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from django_pgjobs.models import Job, JobResult
from tests import flow_jobs
from tests.conftest import WorkerProcess, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_a_worker_claiming_during_a_burst_runs_each_job_once_with_its_own_arguments(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    worker = start_worker("--queues", "flow-debounce", "--concurrency", "4")
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def send(index: int) -> None:
        try:
            barrier.wait(10)
            for n in range(index, 1000, 8):
                flow_jobs.reindex_soon.enqueue(5, version=n)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    last = flow_jobs.reindex_soon.enqueue(5, version=-1)  # after every other enqueue
    wait_until(
        lambda: not Job.objects.exclude(status="completed").exists(),
        timeout=60,
        message="every debounced job to complete",
    )
    assert worker.proc.poll() is None, worker.output()
    jobs = list(Job.objects.order_by("id"))
    results: dict[int, Any] = dict(JobResult.objects.values_list("job_id", "value"))
    for job in jobs:  # each ran once, with the arguments it holds
        assert job.attempts == 1, job
        assert results[job.id] == {"doc_id": 5, "version": job.kwargs["version"]}, job
    # the last enqueue joined the newest job (no older one was still pending)
    assert jobs[-1].id == last.id and results[last.id]["version"] == -1
