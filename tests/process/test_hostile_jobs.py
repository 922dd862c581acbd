"""Hostile jobs and hostile rows against a real ``runjobs``:
nothing a job does to the event loop or its process, and no value stored in a row,
stops the worker serving its other jobs (docs/explanation/guarantees.md)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from django_pgjobs.models import Job, JobResult
from tests.conftest import WorkerProcess, wait_until
from tests.testapp import core_jobs, jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

DEEP = "(repeat('[', 3000) || repeat(']', 3000))::jsonb"


def _status(*ids: int) -> dict[int, str]:
    return dict(Job.objects.filter(id__in=ids).values_list("id", "status"))


def _settled(ids: list[int]) -> bool:
    return all(s in ("completed", "dead") for s in _status(*ids).values())


def _stop(w: WorkerProcess) -> None:
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0, w.output()[-3000:]


def test_rows_that_cannot_be_decoded_fail_alone_and_their_batch_mates_run(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Row A: a trace_context of 3,000 levels raised RecursionError after the claim had
    committed; the row and its batch-mates stayed running, re-claimed together by
    every reap, and the innocent jobs ended dead without having run."""
    hostile = [jobs.add.enqueue(0, i) for i in range(3)]
    innocent = [jobs.add.enqueue(1, i) for i in range(6)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE django_pgjobs_job SET trace_context = {DEEP} WHERE id = %s", [hostile[0].id]
        )
        cursor.execute(f"UPDATE django_pgjobs_job SET args = {DEEP} WHERE id = %s", [hostile[1].id])
        cursor.execute(
            "UPDATE django_pgjobs_job SET kwargs = '{\"b\": 1e5000}'::jsonb WHERE id = %s",
            [hostile[2].id],
        )
    w = start_worker("--burst", "--no-maintenance", "--concurrency", "4")
    assert w.wait(timeout=90) == 0, w.output()[-3000:]
    innocent_ids = [j.id for j in innocent]
    assert set(_status(*innocent_ids).values()) == {"completed"}
    assert sorted(
        JobResult.objects.filter(job_id__in=innocent_ids).values_list("value", flat=True)
    ) == [1, 2, 3, 4, 5, 6]
    # The trace is ignored (a trace is never worth failing a job for): the job runs.
    assert _status(hostile[0].id) == {hostile[0].id: "completed"}
    for bad in hostile[1:]:
        bad.refresh_from_db()
        assert bad.status == "dead" and bad.attempts == 1, bad.status
        assert "cannot be decoded" in (bad.last_error or ""), bad.last_error


def test_nothing_an_async_job_does_to_the_loop_stops_the_worker(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Row D: loop.stop() in a job closed the worker's event loop: the in-flight
    neighbour was dead-lettered with CancelledError, and the next async claim made
    runjobs exit 1 (``Event loop is closed``)."""
    neighbour = core_jobs.async_sleep.enqueue(3.0)
    offenders = {
        "stop": core_jobs.stops_the_loop.using(delay=0.5).enqueue(),
        "close": core_jobs.closes_the_loop.using(delay=0.5).enqueue(),
        "exit": core_jobs.spawns_an_exit.using(delay=0.5).enqueue("exit"),
        "interrupt": core_jobs.spawns_an_exit.using(delay=0.5).enqueue("interrupt"),
    }
    later = [core_jobs.async_sleep.using(delay=2).enqueue(0.05) for _ in range(5)]
    later_sync = [jobs.add.using(delay=2).enqueue(2, i) for i in range(3)]
    w = start_worker("--no-maintenance")
    ids = [neighbour.id, *(j.id for j in offenders.values()), *(j.id for j in later + later_sync)]
    wait_until(
        lambda: _settled(ids) or w.proc.poll() is not None, timeout=90, message="every job to end"
    )
    assert w.proc.poll() is None, w.output()[-3000:]
    statuses = _status(*ids)
    assert statuses[neighbour.id] == "completed", w.output()[-3000:]
    assert {statuses[j.id] for j in later + later_sync} == {"completed"}
    # The offenders fail alone, each with a clear error; a spawned task's exit is
    # logged and its spawner goes on.
    stopped = Job.objects.get(id=offenders["stop"].id)
    assert stopped.status == "dead" and "may not stop" in (stopped.last_error or ""), (
        stopped.last_error
    )
    closed = Job.objects.get(id=offenders["close"].id)
    assert closed.status == "dead" and "close" in (closed.last_error or ""), closed.last_error
    assert statuses[offenders["exit"].id] == "completed"
    assert statuses[offenders["interrupt"].id] == "completed"
    assert "SystemExit" in w.output() and "KeyboardInterrupt" in w.output()
    _stop(w)


def test_a_job_blocking_the_loop_is_named_and_the_worker_goes_on(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Item 4: a loop watchdog logs the culprit task's job id while it blocks."""
    blocker = core_jobs.blocks_the_loop.enqueue(4.0)
    others = [core_jobs.async_sleep.using(delay=1).enqueue(0.05) for _ in range(3)]
    w = start_worker("--no-maintenance")
    ids = [blocker.id, *(j.id for j in others)]
    wait_until(lambda: _settled(ids), timeout=90, message="every job to end")
    assert set(_status(*ids).values()) == {"completed"}
    wait_until(
        lambda: f"job {blocker.id}" in w.output() and "blocked the event loop" in w.output(),
        timeout=30,
        message="the loop watchdog's warning",
    )
    _stop(w)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (it exited; its parent did not reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("raise_in_child", [False, True])
def test_a_forked_child_of_a_job_exits_when_the_job_returns_in_it(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path, raise_in_child: bool
) -> None:
    """Row H: a job that forks and returns in the child left the child running the
    job-thread loop, orphaned after the worker exited (and deaf to one SIGTERM)."""
    marker = tmp_path / "child.pid"
    job = core_jobs.forks.enqueue(str(marker), raise_in_child)
    w = start_worker("--no-maintenance")
    wait_until(
        lambda: marker.exists() and marker.read_text().strip(), timeout=60, message="the child"
    )
    child = int(marker.read_text())
    wait_until(lambda: not _alive(child), timeout=30, message=f"the forked child {child} to exit")
    wait_until(lambda: _settled([job.id]), timeout=60, message="the forking job to end")
    job.refresh_from_db()
    assert job.status == "completed" and JobResult.objects.get(job_id=job.id).value == child
    after = jobs.add.enqueue(3, 4)  # the worker goes on serving
    wait_until(lambda: _settled([after.id]), timeout=60, message="the next job")
    assert _status(after.id) == {after.id: "completed"}
    _stop(w)
