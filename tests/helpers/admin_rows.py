"""Builders for the admin tests: jobs in every state, made through the real code paths.

No row is written by hand: pending rows are enqueued, completed and dead rows are
run by ``run_jobs``, running rows are claimed with the worker's claim statement,
and stuck rows are claimed rows whose heartbeat really went stale.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import connection
from django.test import Client
from django.urls import reverse

from django_pgjobs import claim
from django_pgjobs.conf import get_settings
from django_pgjobs.db.job_admin import job_cancel
from django_pgjobs.db.job_outcome import job_heartbeat
from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from tests.conftest import wait_until
from tests.testapp.jobs import add, always_fails

CHANGELIST = "admin:django_pgjobs_job_changelist"
OVERVIEW = "admin:django_pgjobs_job_overview"
REAP = "admin:django_pgjobs_job_reap"


def changelist_url(**params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return reverse(CHANGELIST) + (f"?{query}" if query else "")


def pending(queue: str = "default", *, delay: float | None = None, **kwargs: Any) -> Job:
    options: dict[str, Any] = {"queue": queue, **kwargs}
    if delay is not None:
        options["delay"] = delay
    return add.using(**options).enqueue(1, 2)


def completed(queue: str = "default") -> Job:
    job = add.using(queue=queue).enqueue(2, 3)
    ran = run_jobs(queues=[queue])
    assert [r.status for r in ran if r.id == job.id] == ["completed"]
    return Job.objects.get(id=job.id)


def dead(queue: str = "default", message: str = "boom") -> Job:
    job = always_fails.using(queue=queue, max_attempts=1).enqueue(message)
    ran = run_jobs(queues=[queue])
    assert [r.status for r in ran if r.id == job.id] == ["dead"]
    return Job.objects.get(id=job.id)


def running(queue: str = "default") -> Job:
    job = pending(queue)
    claimed = claim.claim(connection, worker="admin-test-worker", queues=[queue], n=1)
    assert [c.id for c in claimed] == [job.id], "the queue must hold only this due job"
    return Job.objects.get(id=job.id)


def cancelled(queue: str = "default") -> Job:
    job = pending(queue)
    assert job_cancel(connection, [job.id]) == {job.id}
    return Job.objects.get(id=job.id)


def wait_stuck(*jobs: Job) -> None:
    """Wait (with a deadline) until the jobs' heartbeats are older than STALE_AFTER."""
    ids = {j.id for j in jobs}
    wait_until(
        lambda: ids <= set(Job.objects.stuck().values_list("id", flat=True)),
        timeout=get_settings().STALE_AFTER * 5,
        message="jobs to become stuck",
    )


def keep_fresh(*jobs: Job) -> None:
    """Heartbeat running jobs now (as their live worker would)."""
    lost = job_heartbeat(connection, [(j.id, j.lease) for j in jobs])
    assert not lost


def listed_ids(client: Client, url: str) -> list[int]:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return [job.id for job in response.context["cl"].result_list]


def post_action(client: Client, action: str, ids: list[int], url: str | None = None) -> Any:
    return client.post(
        url or changelist_url(),
        {
            "action": action,
            "_selected_action": [str(i) for i in ids],
            "index": "0",
        },
        follow=True,
    )


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def text(response: Any) -> str:
    """The response body with tags stripped and whitespace collapsed."""
    body = re.sub(r"<[^>]+>", " ", response.content.decode())
    return re.sub(r"\s+", " ", body)
