"""Helpers for the worker/reaper tests: put a job row in a given state, read rows raw.

Rows are put in place with plain UPDATEs (as an admin or psql session could), so a
test can start from any state without running the operations under test.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from django_pgjobs.db.tables import JOB
from django_pgjobs.models import Job
from django_pgjobs.states import TERMINAL, JobStatus


def make_job(
    status: str = JobStatus.PENDING,
    *,
    task: str = "tests.testapp.jobs.add",
    args: list[Any] | None = None,
    queue: str = "default",
    priority: int = 0,
    attempts: int | None = None,
    max_attempts: int = 5,
    lease: int | None = None,
    heartbeat_age: float = 0.0,
    run_at_delta: float = -1.0,
    **extra: Any,
) -> Job:
    """A job in ``status``: running rows get attempts=1, lease=1 and a heartbeat
    ``heartbeat_age`` seconds old; terminal rows get ``finished_at``."""
    job = Job.objects.enqueue(
        task,
        args=[1, 2] if args is None else args,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        **extra,
    )
    now = timezone.now()
    fields: dict[str, Any] = {"status": status, "run_at": now + timedelta(seconds=run_at_delta)}
    if status == JobStatus.BLOCKED:  # a workflow node waiting for one parent
        fields.update(waiting=1, failed_parents=0)
        if lease is not None:
            fields["lease"] = lease
    if status not in (JobStatus.PENDING, JobStatus.BLOCKED):
        fields.update(
            attempts=1 if attempts is None else attempts,
            lease=1 if lease is None else lease,
            started_at=now,
            heartbeat_at=now - timedelta(seconds=heartbeat_age),
            worker="test-worker",
        )
    elif attempts is not None:
        fields["attempts"] = attempts
    if status in TERMINAL:
        fields["finished_at"] = now
    Job.objects.filter(id=job.id).update(**fields)
    job.refresh_from_db()
    return job


def snapshot(job_id: int) -> dict[str, Any]:
    """The whole row as JSON (every column), to prove a write changed nothing."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_to_json(j)::text FROM {JOB} j WHERE id = %s", [job_id])
        row = cursor.fetchone()
    import json

    return json.loads(row[0])


def statuses() -> dict[str, int]:
    """Counts of jobs per status."""
    from django.db.models import Count

    return dict(Job.objects.values_list("status").annotate(n=Count("id")).order_by())


def query(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run ``statement`` on the test connection; its rows (none for a plain write)."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []
