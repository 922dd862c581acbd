"""What a workflow's statements cost the database, read from ``pg_stat_xact_user_tables``
(this transaction's own table access, triggers and functions included)."""

from __future__ import annotations

from typing import Any

from django.db import connection

from django_pgjobs import chord, claim, group
from django_pgjobs.db.job_outcome import job_complete_many
from django_pgjobs.models import Job
from tests import workflow_jobs as w

TABLES = ("django_pgjobs_job", "django_pgjobs_jobdependency", "django_pgjobs_workflow")


def access() -> dict[str, tuple[int, int, int]]:
    """Per table: (sequential scans, tuples fetched by index, tuples read by seq scans)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, COALESCE(seq_scan, 0), COALESCE(idx_tup_fetch, 0),"
            " COALESCE(seq_tup_read, 0) FROM pg_stat_xact_user_tables WHERE relname = ANY(%s)",
            [list(TABLES)],
        )
        return {r[0]: (r[1], r[2], r[3]) for r in cursor.fetchall()}


def cost(action: Any) -> dict[str, tuple[int, int, int]]:
    before = access()
    action()
    after = access()
    zero = (0, 0, 0)
    return {
        t: tuple(a - b for a, b in zip(after.get(t, zero), before.get(t, zero), strict=True))  # type: ignore[misc]
        for t in TABLES
    }


def complete_cost(job: Job) -> dict[str, tuple[int, int, int]]:
    """Claim ``job`` (the lowest id pending in its queue), then measure its completion
    alone, with the session's cached plans discarded first: each measurement plans
    the trigger's statements afresh, so two measurements compare like with like."""
    (claimed,) = claim.claim(connection, worker="w", queues=[job.queue], n=1)
    assert claimed.id == job.id
    with connection.cursor() as cursor:
        cursor.execute("DISCARD PLANS")

    def write() -> None:
        done = job_complete_many(connection, [(claimed.id, claimed.lease, 1)], redo=False)
        assert done == {job.id}

    return cost(write)


def chord_of(n: int, queue: str) -> list[Job]:
    members = group(w.double.using(queue=queue).s(i) for i in range(n))
    return chord(members, w.add_up.using(queue=f"{queue}-cb").s()).enqueue().jobs


def member_costs(jobs: list[Job]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cost of completing one member of a chord (not the last), and of completing
    its last member (which releases the callback)."""
    n = len(jobs) - 1
    one = complete_cost(jobs[n - 2])
    last = complete_cost(jobs[n - 1])
    assert Job.objects.get(id=jobs[-1].id).status == "pending"
    return one, last
