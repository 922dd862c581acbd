"""The reaper: stale running jobs back to pending (or dead), in batches, never twice."""

from __future__ import annotations

import threading
from collections import Counter
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections

from django_pgjobs import claim, signals
from django_pgjobs.claim.limited import FLOW_LOCK_KEY
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.reap import JOB_REAP_STALE, job_reap_stale
from django_pgjobs.db.tables import JOB
from django_pgjobs.maintenance.reaper import Reaper
from django_pgjobs.models import Job
from django_pgjobs.models import Worker as WorkerRow
from tests.conftest import dsn, wait_until
from tests.helpers.rows import make_job, snapshot
from tests.testapp import jobs

#: An error entry of a reclaim whose attempt the reaper gave back.
LOST = {
    "attempt": 1,
    "type": "django_pgjobs.exceptions.WorkerLost",
    "message": "worker lost",
    "traceback": None,
    "worker": "w",
    "refunded": True,
}


@pytest.mark.django_db
def test_run_once_reclaims_stale_jobs_and_leaves_fresh_ones() -> None:
    stale = make_job("running", heartbeat_age=30, attempts=1, max_attempts=3, queue="s1")
    # Its workers were lost three times already while it ran alone (a suspect, in its
    # own process), each time with the attempt given back.
    last_try = make_job("running", heartbeat_age=30, attempts=1, max_attempts=3, queue="s2")
    Job.objects.filter(id=last_try.id).update(errors=[LOST | {"isolated": True}] * 3, suspect=True)
    fresh = make_job("running", heartbeat_age=0.5, queue="s3")
    fresh_before = snapshot(fresh.id)
    reaped: list[Any] = []

    def on_reaped(**kwargs: Any) -> None:
        reaped.append(kwargs)

    signals.jobs_reaped.connect(on_reaped)
    try:
        counts = Reaper(stale_after=10, worker="reaper-test").run_once()
    finally:
        signals.jobs_reaped.disconnect(on_reaped)
    assert counts == {"reaped": 2, "pending": 1, "dead": 1}
    stale.refresh_from_db()
    last_try.refresh_from_db()
    # A lost worker costs no attempt (a crashing neighbour must not cost
    # every job of its process an attempt) until it happened max_attempts times.
    assert (stale.status, stale.lease, stale.attempts) == ("pending", 2, 0)
    assert (last_try.status, last_try.lease, last_try.attempts) == ("dead", 2, 1)
    for job, refunded in ((stale, True), (last_try, False)):
        entry = job.errors[-1]
        assert entry["type"] == "django_pgjobs.exceptions.WorkerLost"
        assert entry["worker"] == "test-worker" and entry["attempt"] == 1
        assert entry["refunded"] is refunded
        assert job.last_error.startswith("worker lost: no heartbeat for more than 10s")
    assert snapshot(fresh.id) == fresh_before
    assert len(reaped) == 1 and reaped[0]["worker"] == "reaper-test"
    assert sorted(reaped[0]["jobs"]) == sorted(
        [
            (stale.id, "tests.testapp.jobs.add", "pending"),
            (last_try.id, "tests.testapp.jobs.add", "dead"),
        ]
    )


@pytest.mark.django_db
def test_run_once_works_through_every_batch() -> None:
    made = [make_job("running", heartbeat_age=30, queue=f"b{i}") for i in range(11)]
    assert Reaper(stale_after=10, batch=3).run_once() == {"reaped": 11, "pending": 11}
    assert set(Job.objects.filter(id__in=[j.id for j in made]).values_list("status", "lease")) == {
        ("pending", 2)
    }


@pytest.mark.django_db
def test_reaper_forgets_workers_not_seen_for_stale_after() -> None:
    with connection.cursor() as cursor:
        for wid, age in (("gone", 60), ("alive", 0)):
            cursor.execute(
                "INSERT INTO django_pgjobs_worker (id, host, pid, queues, concurrency, started_at,"
                " last_seen) VALUES (%s, 'h', 1, '[]', 1, now(), now() - make_interval(secs => %s))",
                [wid, age],
            )
    Reaper(stale_after=10).run_once()
    assert list(WorkerRow.objects.values_list("id", flat=True)) == ["alive"]


def _reaper_thread(seen: list[int], errors: list[BaseException], start: threading.Barrier) -> None:
    try:
        with psycopg.connect(dsn(), autocommit=True) as conn:
            start.wait()
            while rows := conn.execute(
                JOB_REAP_STALE,
                {
                    "stale_after": 10,
                    "batch": 7,
                    "message": "worker lost",
                    "type": "WorkerLost",
                    "keep": 20,
                },
            ).fetchall():
                seen.extend(r[0] for r in rows)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.django_db(transaction=True)
def test_many_reapers_never_double_reclaim_or_deadlock() -> None:
    jobs.add.enqueue_many([(i, i) for i in range(600)])
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB} SET status = 'running', attempts = 1, lease = 1, "
            "started_at = now(), heartbeat_at = now() - interval '1 minute'"
        )
    seen: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)
    threads = [
        threading.Thread(target=_reaper_thread, args=(seen, errors, start)) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert [i for i, n in Counter(seen).items() if n > 1] == []
    assert len(seen) == 600
    rows = Job.objects.values_list("status", "lease", "attempts")
    assert set(rows) == {("pending", 2, 0)}
    assert {len(e) for e in Job.objects.values_list("errors", flat=True)} == {1}


@pytest.mark.django_db
def test_reap_jobs_command_once_and_stale_after_option() -> None:
    job = make_job("running", heartbeat_age=1.5)
    out = StringIO()
    call_command("reap_jobs", stdout=out)  # STALE_AFTER is 2 s in the test settings
    assert out.getvalue().strip() == "reaped 0 job(s)"
    out = StringIO()
    call_command("reap_jobs", "--stale-after", "1", stdout=out)
    assert out.getvalue().strip() == "reaped 1 job(s) (pending=1)"
    job.refresh_from_db()
    assert job.status == "pending"


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["0", "-3", "soon", "inf"])
def test_reap_jobs_rejects_bad_stale_after(bad: str) -> None:
    job = make_job("running", heartbeat_age=60)
    with pytest.raises(CommandError, match="--stale-after"):
        call_command("reap_jobs", f"--stale-after={bad}")
    job.refresh_from_db()
    assert job.status == "running"


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_waited_for_the_flow_lock_is_not_stale_when_it_commits() -> None:
    """A limited claim waits for the flow lock as long as another worker holds it (one
    whose claim a GIL-holding job stalled). Its rows' heartbeat is when they are
    claimed, not its transaction's start: else it commits rows already STALE_AFTER
    old, and the reaper takes them from the live worker before its first beat."""
    job = jobs.add.enqueue(1, 2)
    got: list[list[Claimed]] = []

    def claim_limited() -> None:
        try:
            got.append(claim.claim(connection, worker="w", queues=None, n=5, limited=True))
        finally:
            connections.close_all()

    with psycopg.connect(dsn(), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [FLOW_LOCK_KEY])
        thread = threading.Thread(target=claim_limited, daemon=True)
        thread.start()
        waited = "SELECT extract(epoch FROM clock_timestamp() - xact_start) FROM pg_stat_activity"
        # This database only: CI's other legs share the server, and their workers wait
        # on advisory locks of their own (one matched here, and the test ended early).
        waited += " WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
        waited += " AND datname = current_database()"
        wait_until(
            lambda: (row := holder.execute(waited).fetchone()) and row[0] > 5.0,
            message="the claim waiting 5 s for the flow lock",
        )
        holder.execute("SELECT pg_advisory_unlock(%s)", [FLOW_LOCK_KEY])
        thread.join(30)
    assert [[c.id for c in claimed] for claimed in got] == [[job.id]]
    row = Job.objects.get(id=job.id)
    assert (row.heartbeat_at - row.started_at).total_seconds() > 5.0
    # Stale after 4 s: rows stamped with the transaction's start would be 5 s old and
    # more; stamped when claimed, they are as old as this test's last few statements
    # (a second and more on a loaded box: 1 s was too tight).
    assert job_reap_stale(connection, stale_after=4.0) == []
