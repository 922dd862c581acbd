"""Fair shares with real ``runjobs`` processes (docs/howto/control-throughput.md): two
workers rotate over the keys of one queue, so a key's backlog does not hold another
key's jobs back, and the limits still hold beside fair keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from django_pgjobs.models import Job, JobResult, Queue
from tests import fair_jobs, flow_keyed_jobs
from tests.conftest import WorkerProcess, wait_until
from tests.helpers.run_records import max_overlap

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Start = Callable[..., WorkerProcess]
FAIR_ENV = {"PGJOBS_TEST_FAIR": "1"}


def wait_done(ids: Sequence[int], timeout: float = 90) -> None:
    wait_until(
        lambda: Job.objects.filter(id__in=ids, status="completed").count() == len(ids),
        timeout=timeout,
        message=f"{len(ids)} jobs to complete",
    )


def starts(ids: Sequence[int]) -> dict[int, float]:
    return {
        job_id: value["start"]
        for job_id, value in JobResult.objects.filter(job_id__in=ids).values_list("job_id", "value")
    }


def test_two_workers_serve_small_keys_past_a_large_backlog(start_worker: Start) -> None:
    backlog = fair_jobs.tenant_job.enqueue_many([("a", i, 0.01) for i in range(400)])
    assert backlog == 400
    small = [fair_jobs.tenant_job.enqueue(t, i, 0.01).id for t in "bcde" for i in range(5)]
    a_ids = list(
        Job.objects.filter(fair_key="tenant:a").order_by("id").values_list("id", flat=True)
    )
    for _ in range(2):
        start_worker("--queues", "fair", "--concurrency", "2", env=FAIR_ENV)
    wait_done(a_ids + small)
    started = starts(a_ids + small)
    a_starts = sorted(started[i] for i in a_ids)
    # Each small key's five jobs take five turns of the rotation: they are done
    # before a tenth of a's backlog has started (FIFO would start them after all 400).
    assert max(started[i] for i in small) < a_starts[40], (
        sorted(started[i] for i in small)[-1],
        a_starts[:45],
    )


def test_max_running_holds_beside_fair_keys(start_worker: Start) -> None:
    Queue.objects.create(name="fair", max_running=2)
    ids = [fair_jobs.tenant_job.enqueue(t, i, 0.15).id for t in "abc" for i in range(4)]
    for _ in range(2):
        start_worker("--queues", "fair", "--concurrency", "4", env=FAIR_ENV)
    wait_done(ids)
    values = JobResult.objects.filter(job_id__in=ids).values_list("job_id", "value")
    intervals = sorted((v["start"], v["end"], job_id) for job_id, v in values)
    assert max_overlap(intervals) == 2, intervals


def test_concurrency_keys_hold_beside_fair_keys(start_worker: Start) -> None:
    ids = {
        t: [flow_keyed_jobs.limited_tenant_job.enqueue(t, i, 0.15).id for i in range(4)]
        for t in "ab"
    }
    assert Job.objects.filter(id__in=ids["a"]).values_list("fair_key", flat=True)[0] == "tenant:a"
    env = {**FAIR_ENV, "PGJOBS_TEST_KEYED": "1"}
    for _ in range(2):
        start_worker("--queues", "fair-limited", "--concurrency", "4", env=env)
    wait_done(ids["a"] + ids["b"])
    both = []
    for tenant_ids in ids.values():
        values = JobResult.objects.filter(job_id__in=tenant_ids).values_list("job_id", "value")
        intervals = sorted((v["start"], v["end"], job_id) for job_id, v in values)
        assert max_overlap(intervals) == 1, intervals  # one run of a key at once
        both += intervals
    assert max_overlap(sorted(both)) == 2  # the two keys ran side by side
