"""Workflows with real ``runjobs`` processes: chord members finishing at the same
moment on three workers, workers SIGKILLed while chords complete, and the proof
that no window exists between a parent's completion and its child's release.

Timings come from tests/settings.py (heartbeat 0.5 s, stale after 2 s, reaper every
0.5 s): a killed worker's job is reclaimed within about 3 s.
"""

from __future__ import annotations

import io
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from django.core.management import call_command

from django_pgjobs import Workflow, WorkflowRun, chord, claim, group
from django_pgjobs.db.job_outcome import job_complete_many
from django_pgjobs.models import Job, JobResult
from tests import workflow_jobs as w
from tests.conftest import WorkerProcess, dsn, wait_until
from tests.helpers.rows import query

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Start = Callable[..., WorkerProcess]


@pytest.fixture
def notes() -> Iterator[str]:
    query("CREATE TABLE wf_notes (seq bigserial, job_id bigint, tag text, pid int)")
    yield "wf_notes"
    query("DROP TABLE IF EXISTS wf_notes")


def all_finished(runs: list[WorkflowRun]) -> bool:
    ids = [r.id for r in runs]
    left = Job.objects.filter(workflow_id__in=ids).exclude(
        status__in=["completed", "dead", "cancelled"]
    )
    return not left.exists()


def notes_by_tag(table: str) -> dict[str, int]:
    return dict(query(f"SELECT tag, count(*) FROM {table} GROUP BY tag"))


def test_chord_members_finishing_together_on_three_workers(start: Start, notes: str) -> None:
    """Each round: 4 chords of 3 members (12 jobs, 12 slots on 3 workers) whose
    members all finish at one instant, plus a workflow whose two fan-ins have
    interleaved members (the order in which a row-by-row release would lock the two
    callbacks differs between completers). Every callback runs exactly once, and no
    completer ever hits a deadlock."""
    workers = [start("--concurrency", "5") for _ in range(3)]
    wait_until(
        lambda: query("SELECT count(*) FROM django_pgjobs_worker")[0][0] == 3,
        timeout=30,
        message="3 workers registered",
    )
    expected: dict[str, int] = {}
    for round_ in range(5):
        deadline = time.time() + 2.0
        runs = []
        for c in range(4):
            tag = f"r{round_}c{c}"
            members = group(w.finish_at.s(deadline, i) for i in range(3))
            runs.append(chord(members, w.note.si(notes, tag)).enqueue())
            expected[tag] = 1
        wf = Workflow(f"interleaved {round_}")
        left, right = [], []
        for i in range(3):
            left.append(wf.add(w.finish_at.s(deadline, i)))
            right.append(wf.add(w.finish_at.s(deadline, i)))
        wf.add(w.note.si(notes, f"r{round_}L"), after=left)
        wf.add(w.note.si(notes, f"r{round_}R"), after=right)
        expected[f"r{round_}L"] = expected[f"r{round_}R"] = 1
        runs.append(wf.enqueue())
        wait_until(
            lambda runs=runs: all_finished(runs), timeout=60, message=f"round {round_} finished"
        )
    assert notes_by_tag(notes) == expected
    statuses = set(Job.objects.values_list("status", flat=True))
    assert statuses == {"completed"}
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0
        assert "deadlock" not in worker.output().lower(), worker.output()[-3000:]


def test_sigkilled_workers_never_lose_or_double_a_callback(start: Start, notes: str) -> None:
    """Workers are SIGKILLed again and again while chords complete: a killed
    completion rolls back with its release (one transaction), the reaper gives the
    member back, and every callback (an atomic job: its row commits with its
    completion) runs to completion exactly once, with its group's results."""
    rng = random.Random(7)
    workers = [start("--concurrency", "4") for _ in range(3)]
    runs = []
    for c in range(12):
        members = group(w.sleep_value.s(rng.uniform(0.05, 0.4), c * 10 + i) for i in range(4))
        runs.append(chord(members, w.note_once.si(notes, f"c{c}")).enqueue())
    end = time.monotonic() + 8
    kills = 0
    while time.monotonic() < end and not all_finished(runs):
        time.sleep(rng.uniform(0.3, 0.8))
        victim = rng.randrange(len(workers))
        workers[victim].signal(signal.SIGKILL)
        workers[victim].wait(10)
        kills += 1
        workers[victim] = start("--concurrency", "4")
    wait_until(lambda: all_finished(runs), timeout=90, message="every chord finished")
    assert kills > 0
    assert notes_by_tag(notes) == {f"c{c}": 1 for c in range(12)}
    for run in runs:
        rows = {j.id: Job.objects.get(id=j.id) for j in run.jobs}
        assert {r.status for r in rows.values()} == {"completed"}
        callback = rows[run.jobs[-1].id]
        # released once: it was blocked until its last member committed, then ran
        assert callback.waiting == 0 and callback.failed_parents == 0


def test_completion_and_release_are_one_transaction(other_connection: psycopg.Connection) -> None:
    """The window "parent completed, child not yet released" does not exist: the
    release is written by the completion's own statement (the trigger), so a
    second session sees both or neither, and killing the completing backend before
    its COMMIT leaves neither."""
    run = chord([w.double.s(1), w.double.s(2)], w.add_up.s()).enqueue()
    callback = run.jobs[-1].id
    for attempt in ("killed", "committed"):
        conn = psycopg.connect(dsn())
        try:
            claimed = claim.claim(conn, worker="w", queues=None, n=2)
            conn.commit()
            assert {c.id for c in claimed} <= {j.id for j in run.jobs[:2]}
            done = job_complete_many(conn, [(c.id, c.lease, 1) for c in claimed], redo=False)
            assert done == {c.id for c in claimed}
            # completed and released inside the open transaction; nobody else sees it
            seen = other_connection.execute(
                "SELECT status FROM django_pgjobs_job WHERE id = ANY(%s) ORDER BY id",
                [[j.id for j in run.jobs]],
            ).fetchall()
            if attempt == "killed":
                assert [s for (s,) in seen] == ["running", "running", "blocked"]
                pid = conn.info.backend_pid
                other_connection.execute("SELECT pg_terminate_backend(%s)", [pid])
                wait_until(
                    lambda p=pid: (
                        not other_connection.execute(
                            "SELECT 1 FROM pg_stat_activity WHERE pid = %s", [p]
                        ).fetchone()
                    ),
                    timeout=10,
                    message="backend gone",
                )
                after = other_connection.execute(
                    "SELECT status, waiting FROM django_pgjobs_job WHERE id = ANY(%s) ORDER BY id",
                    [[j.id for j in run.jobs]],
                ).fetchall()
                assert after == [("running", 0), ("running", 0), ("blocked", 2)]
                # the reaper's way back: the members are pending again
                other_connection.execute(
                    "UPDATE django_pgjobs_job SET status = 'pending', attempts = 0"
                    " WHERE id = ANY(%s)",
                    [[j.id for j in run.jobs[:2]]],
                )
            else:
                conn.commit()
                after = other_connection.execute(
                    "SELECT status FROM django_pgjobs_job WHERE id = ANY(%s) ORDER BY id",
                    [[j.id for j in run.jobs]],
                ).fetchall()
                assert [s for (s,) in after] == ["completed", "completed", "pending"]
        finally:
            conn.close()
    assert Job.objects.get(id=callback).status == "pending"


def test_a_child_retried_after_its_parent_waits_for_the_running_parent(
    start: Start, tmp_path: Path
) -> None:
    """``a`` dies, its child ``b`` (``"run"``) runs without it and dies; ``retry_jobs
    --ids`` of ``a`` (which then runs and waits), then of ``b``: ``b`` waits, blocked,
    while ``a`` runs on a live worker, and runs once ``a`` completed, once, with its
    result, never pending and running at once beside ``a``."""
    allow, go = tmp_path / "allow", tmp_path / "go"
    start("--concurrency", "4")
    wf = Workflow("retry order")
    a = wf.add(w.dies_until.s(str(allow), 21, str(go)), name="a")
    wf.add(w.needs_parents.s(), after=[a], name="b", on_parent_failure="run")
    a_id, b_id = (job.id for job in wf.enqueue().jobs)

    def status(job_id: int) -> str:
        return Job.objects.get(id=job_id).status

    wait_until(lambda: status(b_id) == "dead", timeout=30, message="a and b dead")
    assert status(a_id) == "dead"
    allow.touch()
    call_command("retry_jobs", "--ids", str(a_id), stdout=io.StringIO())
    wait_until(lambda: status(a_id) == "running", timeout=30, message="a running again")
    call_command("retry_jobs", "--ids", str(b_id), stdout=io.StringIO())
    b = Job.objects.get(id=b_id)
    assert (b.status, b.waiting) == ("blocked", 1)
    go.touch()
    wait_until(lambda: status(b_id) == "completed", timeout=30, message="b completed")
    a_row, b_row = Job.objects.get(id=a_id), Job.objects.get(id=b_id)
    assert JobResult.objects.get(job_id=b_id).value == {"a": 21}
    assert b_row.attempts == 1 and b_row.started_at >= a_row.finished_at


@pytest.fixture
def start(start_worker: Start) -> Start:
    return start_worker
