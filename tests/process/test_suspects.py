"""A crash is charged to the crasher (docs/explanation/guarantees.md): jobs reclaimed
from a lost worker are suspects and run alone in a child process until a run of
theirs ends normally; a child that dies charges that run to its job alone.

Real ``runjobs`` subprocesses restarted by a supervisor loop; timings from
tests/settings.py (heartbeat 0.5 s, stale after 2 s, reaper every 0.5 s)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_pgjobs.db.reap import job_reap_stale
from django_pgjobs.models import Job, JobResult
from tests.conftest import WorkerProcess, wait_until
from tests.helpers.rows import make_job, query
from tests.testapp import core_jobs, jobs

Start = Callable[..., WorkerProcess]


LOST = "django_pgjobs.exceptions.WorkerLost"
CRASHED = "django_pgjobs.exceptions.JobCrashed"


@pytest.fixture
def runs() -> Iterator[str]:
    """Where ``record_run`` says which process ran it."""
    query("CREATE TABLE suspect_runs (job_id bigint, lease bigint, pid int)")
    yield "suspect_runs"
    query("DROP TABLE IF EXISTS suspect_runs")


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid`` that run a job (not its heartbeat process,
    ``django_pgjobs.pulse``): Linux lists them per thread that started them."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return [p for p in found if not _is_pulse(p)]


def _is_pulse(pid: int) -> bool:
    try:
        return b"django_pgjobs.pulse" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False  # gone already: not the worker's heartbeat process


def make_suspect(job: Job) -> None:
    Job.objects.filter(id=job.id).update(suspect=True)


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_crash_is_charged_to_the_crasher_and_its_neighbours_complete(
    start_worker: Start, runs: str
) -> None:
    # Finding C: os._exit(9) next to three innocent 2-second jobs, two attempts each,
    # the worker restarted by a supervisor. Before suspects, all four were reclaimed
    # together after every crash and the innocents ended dead ("lost too often").
    innocents = [
        jobs.record_run.using(queue="crash", max_attempts=2).enqueue(runs, 2.0) for _ in range(3)
    ]
    crasher = jobs.exits_nine.using(queue="crash").enqueue(0.5)
    ids = [j.id for j in innocents] + [crasher.id]
    workers = [start_worker("--queues", "crash", "--concurrency", "4")]

    def supervised_until_settled() -> bool:
        if workers[-1].proc.poll() is not None:  # the supervisor: restart what exited
            assert len(workers) < 5, f"the worker keeps dying: {workers[-1].output()}"
            workers.append(start_worker("--queues", "crash", "--concurrency", "4"))
        statuses = dict(Job.objects.filter(id__in=ids).values_list("id", "status"))
        return all(statuses[i] in ("completed", "dead") for i in ids)

    wait_until(
        supervised_until_settled,
        timeout=180,
        interval=0.2,
        message="the innocent jobs and the crasher to finish",
    )
    # The crasher took the first worker down once, and never a worker again.
    assert workers[0].wait(timeout=10) == 9, workers[0].output()
    assert len(workers) == 2, [w.output() for w in workers]
    assert workers[1].proc.poll() is None, workers[1].output()

    ran = query(f"SELECT job_id, pid FROM {runs}")
    for job in innocents:
        row = Job.objects.get(id=job.id)
        assert (row.status, row.attempts, row.suspect) == ("completed", 1, False), row.errors
        [lost] = row.errors  # reclaimed once, with the attempt given back
        assert lost["type"] == LOST and lost["refunded"] is True and lost["isolated"] is False
        assert JobResult.objects.get(job_id=job.id).value == job.id
        # It ran to the end exactly once, alone: in a child, not in the worker.
        [(_, pid)] = [r for r in ran if r[0] == job.id]
        assert pid not in (workers[0].pid, workers[1].pid)

    row = Job.objects.get(id=crasher.id)
    assert (row.status, row.attempts) == ("dead", 2), row.errors
    assert [e["type"] for e in row.errors] == [LOST, CRASHED, CRASHED]
    for entry in row.errors[1:]:
        assert "the job killed its process (exit 9)" in entry["message"]
    assert "killed its process (exit 9)" in (row.last_error or "")
    assert row.suspect is True  # it never ran to an outcome


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_suspect_runs_alone_and_is_cleared_once_it_ends_normally(
    start_worker: Start, runs: str
) -> None:
    passes = jobs.record_run.using(queue="sus").enqueue(runs, 0)
    fails = jobs.always_fails.using(queue="sus", max_attempts=2).enqueue("plain failure")
    # An atomic job completes inside its own transaction, in the child; an async one
    # runs on the child's own event loop.
    atomic = jobs.atomic_insert.using(queue="sus").enqueue(runs, 0)
    awaited = core_jobs.async_sleep.using(queue="sus").enqueue(0.01)
    for job in (passes, fails, atomic, awaited):
        make_suspect(job)
    worker = start_worker("--queues", "sus")
    wait_until(
        lambda: (
            set(Job.objects.filter(queue="sus").values_list("status", flat=True))
            == {"completed", "dead"}
        ),
        timeout=120,
        message="the suspects to finish",
    )
    for job in (atomic, awaited):
        row = Job.objects.get(id=job.id)
        assert (row.status, row.attempts, row.suspect) == ("completed", 1, False), row.errors
    assert query(f"SELECT lease FROM {runs} WHERE job_id = %s", [atomic.id]) == [(1,)]
    assert JobResult.objects.get(job_id=atomic.id).value == 1
    assert len(JobResult.objects.get(job_id=awaited.id).value) == 2

    row = Job.objects.get(id=passes.id)
    assert (row.status, row.attempts, row.suspect) == ("completed", 1, False)
    assert JobResult.objects.get(job_id=passes.id).value == passes.id
    [(pid,)] = query(f"SELECT pid FROM {runs} WHERE job_id = %s", [passes.id])
    assert pid != worker.pid  # it ran in a child process of its own
    # Alone: the first run of each; the failure's retry, cleared, ran in the worker.
    assert worker.output().count("running it alone in process") == 4, worker.output()

    row = Job.objects.get(id=fails.id)
    assert (row.status, row.attempts, row.suspect) == ("dead", 2, False)
    assert [(e["type"], e["message"]) for e in row.errors] == [
        ("builtins.ValueError", "plain failure")
    ] * 2


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_suspect_obeys_its_timeout_and_its_worker_lives_on(start_worker: Start) -> None:
    stuck = jobs.times_out.using(queue="sus-t", timeout=3, max_attempts=1).enqueue(600)
    make_suspect(stuck)
    worker = start_worker("--queues", "sus-t")
    wait_until(lambda: children_of(worker.pid), timeout=60, message="the isolated child")
    wait_until(
        lambda: Job.objects.get(id=stuck.id).status == "dead",
        timeout=60,
        message="the isolated run to be given up on after its timeout",
    )
    row = Job.objects.get(id=stuck.id)
    assert row.errors[-1]["type"] == "django_pgjobs.exceptions.JobTimeout"
    assert row.suspect is True  # given up on: it has not shown that it ends well
    # Its process was killed (a thread could only have been abandoned).
    wait_until(lambda: not children_of(worker.pid), timeout=30, message="the child to be gone")
    # And the worker serves on.
    after = jobs.add.using(queue="sus-t").enqueue(2, 3)
    wait_until(
        lambda: Job.objects.get(id=after.id).status == "completed",
        timeout=60,
        message="the next job to complete",
    )
    assert worker.proc.poll() is None, worker.output()


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_the_worker_of_a_suspect_survives_its_child_being_killed(start_worker: Start) -> None:
    # Killed from outside (an OOM kill, say) rather than by itself: charged the same.
    victim = jobs.times_out.using(queue="sus-k", timeout=None, max_attempts=2).enqueue(600)
    make_suspect(victim)
    worker = start_worker("--queues", "sus-k")
    [child] = wait_until(lambda: children_of(worker.pid), timeout=60, message="the child")
    os.kill(child, 9)
    wait_until(
        lambda: Job.objects.get(id=victim.id).errors,
        timeout=60,
        message="the crash to be charged",
    )
    row = Job.objects.get(id=victim.id)
    assert row.errors[0]["type"] == CRASHED
    assert "the job killed its process (SIGKILL)" in row.errors[0]["message"]
    # Retried (and perhaps claimed again already), still a suspect: it runs alone again.
    assert row.status in ("pending", "running") and row.suspect is True
    assert worker.proc.poll() is None, worker.output()


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie waiting for its parent to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_an_isolated_child_ends_with_its_worker(start_worker: Start) -> None:
    job = jobs.times_out.using(queue="sus-w", timeout=None).enqueue(600)
    make_suspect(job)
    worker = start_worker("--queues", "sus-w")
    [child] = wait_until(lambda: children_of(worker.pid), timeout=60, message="the child")
    os.kill(worker.pid, signal.SIGKILL)  # an operator's kill -9 of the worker alone
    worker.wait(timeout=30)
    wait_until(lambda: not alive(child), timeout=30, message="the orphaned child to exit")


@pytest.mark.django_db
def test_only_losses_of_a_job_running_alone_count_towards_lost_too_often() -> None:
    refunded = {"type": LOST, "message": "worker lost", "attempt": 1, "refunded": True}
    # Lost with its neighbours many times, never while alone: given back, now a suspect.
    neighbour = make_job("running", heartbeat_age=30, max_attempts=2, queue="n")
    Job.objects.filter(id=neighbour.id).update(errors=[refunded | {"isolated": False}] * 5)
    # Lost twice already while running alone (max_attempts 2): dead-lettered.
    alone = make_job("running", heartbeat_age=30, max_attempts=2, queue="a")
    Job.objects.filter(id=alone.id).update(errors=[refunded | {"isolated": True}] * 2, suspect=True)
    job_reap_stale(connection, stale_after=10)

    row = Job.objects.get(id=neighbour.id)
    assert (row.status, row.attempts, row.suspect) == ("pending", 0, True)
    assert row.errors[-1]["refunded"] is True and row.errors[-1]["isolated"] is False
    row = Job.objects.get(id=alone.id)
    assert row.status == "dead" and "lost too often" in (row.last_error or "")
    assert row.errors[-1]["refunded"] is False and row.errors[-1]["isolated"] is True
