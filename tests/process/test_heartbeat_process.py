"""The heartbeat process (django_pgjobs/pulse.py): a worker that is alive is never
taken for dead, even while a job holds the GIL (docs/explanation/guarantees.md).

Real ``runjobs`` processes and a real heartbeat process: a job holding the GIL in
one C call longer than STALE_AFTER runs once; without the process it is reclaimed
while it runs. The process dies with its worker, does not beat for a stopped
worker, and a worker whose process cannot start falls back to its thread.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from django_pgjobs import signals
from django_pgjobs.db.job_outcome import JOB_HEARTBEAT_PULSE
from django_pgjobs.db.reap import job_reap_stale
from django_pgjobs.db.workers import WORKER_UPSERT
from django_pgjobs.models import Job, JobResult
from django_pgjobs.models import Worker as WorkerRow
from django_pgjobs.pulse import Pulse, stopped
from django_pgjobs.support.pgconn import psycopg_params
from django_pgjobs.worker.loop import Worker
from django_pgjobs.worker.pulse_link import PulseLink
from tests.conftest import ROOT, WorkerProcess, run_burst_worker, wait_until
from tests.faults import pulse_faults
from tests.faults.injector import Injector
from tests.helpers import run_records
from tests.helpers.heartbeat import (
    HOLD,
    HOLD_ON_CUE,
    STALE_AFTER,
    TIMINGS,
    db_clock,
    gone,
    job_row,
    pulse_of,
    running_on,
)
from tests.helpers.rows import make_job
from tests.testapp import core_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True)

Start = Callable[..., WorkerProcess]


# -- row C': a job holding the GIL -----------------------------------------------------


@pytest.mark.process
def test_a_job_holding_the_gil_longer_than_stale_after_runs_once(
    start_worker: Start, tmp_path: Path
) -> None:
    run_records.create()
    job = jobs.holds_gil.enqueue("gil", HOLD)
    files = [tmp_path / f"health-{i}" for i in range(2)]
    workers = [
        start_worker("--concurrency", "1", "--health-file", str(f), env=TIMINGS) for f in files
    ]
    oldest = 0.0  # the oldest a health file got while the job ran (runjobs --health-file)

    def finished() -> Job | None:
        nonlocal oldest
        if run_records.unfinished("gil"):
            ages = [time.time() - f.stat().st_mtime for f in files if f.exists()]
            oldest = max([oldest, *ages])
        row = job_row(job)
        return row if row.status in ("completed", "dead") else None

    done = wait_until(finished, timeout=90, interval=0.2, message="the GIL-holding job to end")
    ran = run_records.runs("gil")
    assert (done.status, done.attempts, done.lease, len(ran)) == ("completed", 1, 1, 1), ran
    assert done.errors == []
    took = JobResult.objects.get(job_id=job.id).value
    assert took > STALE_AFTER + 1.5, f"the one C call took {took:.1f}s: too short to show anything"
    assert all(f.exists() for f in files)
    # untouched for the whole call (HOLD or more) without the process; a loaded box's slack
    assert oldest < HOLD - 0.5, f"a health file went {oldest:.1f}s untouched"
    for worker in workers:
        assert "changed nothing" not in worker.output()


@pytest.mark.process
def test_an_async_job_blocking_the_event_loop_runs_once(start_worker: Start) -> None:
    """The same, from the worker's event loop (a job blocking the event loop)."""
    job = jobs.holds_gil_async.enqueue(HOLD)
    workers = [start_worker("--concurrency", "1", env=TIMINGS) for _ in range(2)]
    done = wait_until(
        lambda: job_row(job).status in ("completed", "dead") and job_row(job),
        timeout=90,
        interval=0.2,
        message="the loop-blocking job to end",
    )
    assert (done.status, done.attempts, done.lease, done.errors) == ("completed", 1, 1, [])
    took = JobResult.objects.get(job_id=job.id).value
    assert took > STALE_AFTER + 1.5, f"the one C call took {took:.1f}s: too short to show anything"
    assert all("changed nothing" not in w.output() for w in workers)


@pytest.mark.process
def test_without_the_heartbeat_process_the_gil_holder_is_taken_for_dead(
    start_worker: Start,
) -> None:
    """The finding the process fixes (and proof the test above can fail): with the
    worker's thread alone, the job is reclaimed while its first run still goes on."""
    run_records.create()
    # Held 6 s longer than HOLD: the second worker starts once the run has, and on a
    # loaded box its start-up alone took longer than HOLD (the run ended unreclaimed).
    job = jobs.holds_gil.enqueue("gil-off", HOLD + 6)
    env = {**TIMINGS, "PGJOBS_TEST_HEARTBEAT_PROCESS": "0"}
    a = start_worker("--concurrency", "1", env=env)
    wait_until(lambda: run_records.unfinished("gil-off") == 1, timeout=30, message="a run")
    assert pulse_of(a.pid) is None
    start_worker("--concurrency", "1", env=env)
    wait_until(
        lambda: job_row(job).lease >= 2,
        timeout=60,
        message="the live worker's job to be reclaimed",
    )
    assert [e["type"] for e in job_row(job).errors][:1] == ["django_pgjobs.exceptions.WorkerLost"]


def claim_waits(watcher: psycopg.Connection) -> bool:
    """A claim statement (``_CLAIM_SET``) is waiting for a lock."""
    row = watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database() AND query LIKE '%attempts = j.attempts + 1%'"
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.process
def test_jobs_claimed_while_another_job_holds_the_gil_are_kept_alive(
    start_worker: Start, tmp_path: Path
) -> None:
    """The model-based test's "loop" finding: a claim whose reply came
    while a job of the same worker held the GIL had committed its rows (running), but
    the claimer could not read the reply, so neither the in-flight table nor the
    heartbeat process knew them: nothing beat them, the reaper took them from the live
    worker after STALE_AFTER, they ran again elsewhere (as suspects), and the worker's
    own completions were fenced. Made deterministic here: the worker's claim waits on a
    table lock until the GIL is taken, and the reaper runs in this test, once
    STALE_AFTER has passed, while the GIL is still held."""
    holder = core_jobs.holds_gil_on_cue.enqueue(str(tmp_path), HOLD_ON_CUE)
    args = ("--concurrency", "4", "--queues", "default", "--no-maintenance")
    w = start_worker(*args, "--poll-interval", "0.1", env=TIMINGS)
    wait_until(lambda: running_on(holder, w), timeout=60, message="the GIL holder running")
    watcher = psycopg.connect(**psycopg_params("default"), autocommit=True)
    with watcher, transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE django_pgjobs_job IN EXCLUSIVE MODE")
        # Enqueued under the lock: the waiting claim finds them the moment it runs.
        targets = [core_jobs.async_sleep.enqueue(0.2) for _ in range(2)]
        targets.append(jobs.add.enqueue(2, 3))
        wait_until(lambda: claim_waits(watcher), timeout=30, message="a claim waiting")
        (tmp_path / "go").touch()
        wait_until((tmp_path / "holding").exists, timeout=30, message="the GIL taken")
        time.sleep(0.3)  # from that line to its one C call there is no I/O
    released = db_clock()  # the lock: the claim runs now, its rows are no newer
    wait_until(
        lambda: all(running_on(t, w) for t in targets), timeout=30, message="the jobs claimed"
    )
    wait_until(
        lambda: db_clock() - released > STALE_AFTER + 0.5,
        timeout=30,
        message="STALE_AFTER to pass since the claim",
    )
    assert not (tmp_path / "released").exists(), "the GIL was let go too soon: nothing shown"
    reaped = [r[0] for r in job_reap_stale(connection, stale_after=STALE_AFTER)]
    assert reaped == [], f"reaped from the live worker: {reaped}"
    assert not (tmp_path / "released").exists(), "the GIL was let go during the check"
    done = wait_until(
        lambda: all(job_row(t).status == "completed" for t in [holder, *targets]),
        timeout=60,
        message="every job completed",
    )
    assert done
    for t in [holder, *targets]:
        row = job_row(t)
        assert (row.attempts, row.lease, row.errors) == (1, 1, []), (t.id, row.errors)
    assert "changed nothing" not in w.output()
    assert "claimed that the worker had not sent yet" in w.output()  # the process's beat
    assert "their heartbeats refreshed at once" in w.output()  # the slow claim's own
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0, w.output()[-3000:]


# -- tied to its worker's life ---------------------------------------------------------


@pytest.fixture
def runs() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE hp_runs (seq bigserial, job_id bigint, lease bigint, pid int)")
    yield "hp_runs"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS hp_runs")


def running_with_pulse(start: Start, runs: str, seconds: float) -> tuple[Job, WorkerProcess, int]:
    """A job running ``seconds`` on a new worker, and that worker's heartbeat process."""
    job = jobs.record_run.enqueue(runs, seconds)
    worker = start("--concurrency", "1")
    wait_until(lambda: running_on(job, worker), message="the job running on the worker")
    return job, worker, wait_until(lambda: pulse_of(worker.pid), message="its heartbeat process")


@pytest.mark.process
def test_the_heartbeat_process_dies_with_its_worker(start_worker: Start, runs: str) -> None:
    job, a, pulse = running_with_pulse(start_worker, runs, 30.0)
    os.kill(a.pid, signal.SIGKILL)  # the worker alone, not its process group
    a.wait()
    wait_until(lambda: gone(pulse), timeout=10, message="the heartbeat process to exit")
    # ... so the job is reaped as before, and run by another worker.
    b = start_worker("--concurrency", "1")
    wait_until(lambda: running_on(job, b), timeout=60, message="the job reclaimed by b")
    assert job_row(job).lease == 3


@pytest.mark.process
def test_a_stopped_worker_is_still_taken_for_dead(start_worker: Start, runs: str) -> None:
    job, a, pulse = running_with_pulse(start_worker, runs, 3.0)
    os.kill(a.pid, signal.SIGSTOP)  # the worker alone: its heartbeat process sees it stopped
    try:
        b = start_worker("--concurrency", "1")
        wait_until(
            lambda: job_row(job).status == "completed" and f":{b.pid}:" in job_row(job).worker,
            # b's start-up, STALE_AFTER, the reap, then an isolated run (a child
            # process) of 3 s: over 30 s on a loaded CI box.
            timeout=60,
            message="the frozen worker's job completed by b",
        )
        assert not gone(pulse)  # alive all along; it only did not beat
    finally:
        os.kill(a.pid, signal.SIGCONT)
    wait_until(
        lambda: "the complete write changed nothing" in a.output(),
        timeout=20,
        message="the frozen worker's late completion refused",
    )


# -- the process itself ----------------------------------------------------------------


def started_link(
    worker_id: str, on_lost: Callable[[int, int], None], *, interval: float = 0.2
) -> PulseLink:
    """A heartbeat process beating every ``interval`` for a worker row ``worker_id``."""
    link = PulseLink(worker_id=worker_id, on_lost=on_lost)
    row = {"id": worker_id, "host": "h", "pid": os.getpid(), "queues": '["*"]'}
    row |= {"concurrency": 1, "tasks": "[]"}
    config = {"connection": psycopg_params("default"), "interval": interval, "worker_row": row}
    assert link.start({**config, "heartbeat": JOB_HEARTBEAT_PULSE, "worker_upsert": WORKER_UPSERT})
    return link


def test_the_process_beats_for_a_late_worker_and_reports_lost_leases() -> None:
    """No tick from the worker: the process refreshes the jobs it was told of and the
    worker row, and sends back the lease it found lost."""
    ours = make_job("running", heartbeat_age=3600)
    taken = make_job("running", heartbeat_age=3600, lease=5)  # someone else's lease now
    lost: list[tuple[int, int]] = []
    link = started_link("pulse-test", on_lost=lambda j, lease: lost.append((j, lease)))
    try:
        link.added([(ours.id, 1), (taken.id, 4)])
        wait_until(lambda: lost == [(taken.id, 4)], timeout=15, message="the lost lease")
        wait_until(
            lambda: job_row(ours).heartbeat_at > ours.heartbeat_at,
            message="the job's heartbeat refreshed",
        )
        assert WorkerRow.objects.filter(id="pulse-test").exists()
        assert job_row(taken).heartbeat_at == taken.heartbeat_at  # not ours: untouched
    finally:
        proc = link.proc
        link.stop()
    assert proc is not None and proc.returncode == 0


@pytest.mark.parametrize(("began_ago", "beats"), [(0.0, False), (10.0, True)])
def test_the_process_is_quiet_only_while_the_worker_beat_recently(
    began_ago: float, beats: bool
) -> None:
    """The thread's word after each beat keeps the process quiet. The rows hold when
    that beat began, so word of a beat that began long ago (a loaded box, a slow
    server) must not: the rows would age past STALE_AFTER while the process waits."""
    ours = make_job("running", heartbeat_age=3600)
    worker_id = f"pulse-quiet-{began_ago:.0f}"
    # Interval 1 s: the process waits 1.5 s of silence, wide beside the loop's word
    # every 0.1 s plus a query (at 0.2 s it beat once on a loaded CI box).
    link = started_link(worker_id, on_lost=lambda j, lease: None, interval=1.0)
    try:
        link.added([(ours.id, 1)])
        wait_until(link.ready.is_set, message="the process ready")
        end = time.monotonic() + (20.0 if beats else 1.5)
        while time.monotonic() < end and job_row(ours).heartbeat_at == ours.heartbeat_at:
            # as the heartbeat thread does after a beat
            link.beaten(lambda: [(ours.id, 1)], time.monotonic() - began_ago)
            time.sleep(0.1)
        assert (job_row(ours).heartbeat_at != ours.heartbeat_at) is beats
        if beats:  # the row's upsert is the beat's second statement: wait for it
            wait_until(WorkerRow.objects.filter(id=worker_id).exists, message="the worker row")
        else:
            assert not WorkerRow.objects.filter(id=worker_id).exists()
    finally:
        link.stop()


# -- fallback ---------------------------------------------------------------------------


def test_a_worker_whose_process_cannot_start_runs_on_its_thread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    job = jobs.add.enqueue(2, 3)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    worker = Worker(burst=True, maintenance=False, heartbeat_process=True)
    with caplog.at_level(logging.WARNING, logger="django_pgjobs"):
        assert run_burst_worker(worker) == 0
    assert job_row(job).status == "completed"
    # tried again with backoff meanwhile (said once), and degraded until it starts
    pulse = worker.heartbeat.pulse
    assert pulse is not None and "could not start" in (pulse.degraded or "")
    said = [r.getMessage() for r in caplog.records if "no heartbeat process" in r.getMessage()]
    assert len(said) == 1 and "could not start" in said[0], said


def test_heartbeat_process_false_starts_none() -> None:
    worker = Worker(burst=True, maintenance=False, heartbeat_process=False)
    assert worker.heartbeat.pulse is None and worker.inflight.on_add is None


def test_a_lost_lease_heard_from_the_process_cancels_that_run_only() -> None:
    """The process's report names the lease: a report about another lease (a run
    written since, the job claimed again) cancels nothing."""
    fenced: list[dict[str, Any]] = []

    def on_fenced(**kwargs: Any) -> None:
        fenced.append(kwargs)

    job = jobs.wait_for_cancel.enqueue(20.0)
    worker = Worker(burst=True, maintenance=False, poll_interval=0.1)
    signals.job_fenced.connect(on_fenced)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.inflight.unsettled(), message="the job in flight")
        lease = job_row(job).lease
        worker.heartbeat.lost_elsewhere(job.id, lease + 1)
        assert [e.context.is_cancelled() for e in worker.inflight.unsettled()] == [False]
        worker.heartbeat.lost_elsewhere(job.id, lease)
        thread.join(30)
        assert not thread.is_alive()
    finally:
        signals.job_fenced.disconnect(on_fenced)
    assert [(f["job_id"], f["write"]) for f in fenced] == [(job.id, "heartbeat")]
    assert JobResult.objects.get(job_id=job.id).value is True  # it saw the cancel


def test_the_process_imports_no_django() -> None:
    """It must stay small and quick to start: psycopg and the standard library only."""
    code = "import sys, django_pgjobs.pulse; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert "'django'" not in out and "'django_pgjobs'" in out


def test_the_protocol_and_the_beat_in_process() -> None:
    """``Pulse`` run here, not as a process: what the worker's lines do to the lease set,
    and one beat (a lost lease said once, then no longer beaten)."""
    ours = make_job("running", heartbeat_age=3600)
    taken = make_job("running", heartbeat_age=3600, lease=5)
    row = {"id": "pulse-inproc", "host": "h", "pid": os.getpid(), "queues": '["*"]'}
    row |= {"concurrency": 1, "tasks": "[]"}
    config = {"connection": psycopg_params("default"), "interval": 0.2, "worker_row": row}
    config |= {
        "heartbeat": JOB_HEARTBEAT_PULSE,
        "worker_upsert": WORKER_UPSERT,
        "parent": os.getppid(),
    }
    out = io.StringIO()
    pulse = Pulse(config, out)
    began = time.monotonic() - 0.05
    lines = f"+ -7 1\n= @{began:.6f} {ours.id}:1,{taken.id}:4\n+ -9 2\n"  # -: no row
    pulse.read(io.StringIO(lines))
    assert pulse.leases == {ours.id: 1, taken.id: 4, -9: 2} and pulse.eof.is_set()
    assert pulse.last == pulse.heard == pytest.approx(began, abs=1e-5)
    try:
        pulse.beat()
    finally:
        pulse.close()
    answered = f"ok @{began:.6f}"  # each whole set is answered: the process reads
    assert sorted(out.getvalue().splitlines()) == sorted(
        [answered, "lost -9 2", f"lost {taken.id} 4"]
    )
    assert pulse.leases == {ours.id: 1}
    assert job_row(ours).heartbeat_at > ours.heartbeat_at
    assert WorkerRow.objects.filter(id="pulse-inproc").exists()


def reports(out: io.StringIO) -> list[str]:
    """What the process wrote, but its answers to the worker's whole sets."""
    return [line for line in out.getvalue().splitlines() if not line.startswith("ok ")]


def test_the_beat_adopts_running_rows_of_its_worker_it_was_not_told_of() -> None:
    """A claim committed while the worker could not send it (a job holds the GIL): the
    process beats the rows claimed under its worker's id too, once, and from then on
    like the ones it was told of; not another worker's, not a finished one."""
    told = make_job("running", heartbeat_age=3600)
    Job.objects.filter(id=told.id).update(worker="pulse-adopt")
    claimed = make_job("running", heartbeat_age=3600, lease=3)
    Job.objects.filter(id=claimed.id).update(worker="pulse-adopt")
    others = make_job("running", heartbeat_age=3600)  # worker "test-worker"
    done = make_job("completed", lease=1)
    Job.objects.filter(id=done.id).update(worker="pulse-adopt")
    row = {"id": "pulse-adopt", "host": "h", "pid": os.getpid(), "queues": '["*"]'}
    row |= {"concurrency": 1, "tasks": "[]"}
    config = {"connection": psycopg_params("default"), "interval": 0.2, "worker_row": row}
    config |= {"heartbeat": JOB_HEARTBEAT_PULSE, "worker_upsert": WORKER_UPSERT}
    out = io.StringIO()
    pulse = Pulse({**config, "parent": os.getppid()}, out)
    pulse.read(io.StringIO(f"= @{time.monotonic():.6f} {told.id}:1\n"))
    try:
        pulse.beat()
        assert pulse.leases == {told.id: 1, claimed.id: 3}
        assert reports(out) == []  # nothing lost
        for job in (told, claimed):
            assert job_row(job).heartbeat_at > job.heartbeat_at
        assert job_row(others).heartbeat_at == others.heartbeat_at
        # The adopted row reclaimed by another worker meanwhile: lost, said once.
        Job.objects.filter(id=claimed.id).update(lease=4, worker="elsewhere")
        pulse.beat()
        assert reports(out) == [f"lost {claimed.id} 3"]
        assert pulse.leases == {told.id: 1}
    finally:
        pulse.close()


@pytest.mark.parametrize(("mode", "times"), [("raise", 1), ("ambiguous", 2), ("terminate", 2)])
def test_a_failed_beat_is_tried_again_on_a_new_connection(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    mode: str,
    times: int,
) -> None:
    """``Pulse.run`` here, its heartbeat statement failed ``times`` times in a row
    (tests/faults/pulse_faults.py, as in the fault matrix): one failure is tried again
    at once on a new connection, unsaid; when the retry fails too, the failure is said
    once, the next beat (an interval later) refreshes the job, and that is said."""
    ours = make_job("running", heartbeat_age=3600)
    fired = tmp_path / "fired.jsonl"
    plan = {"statement": "pulse:JOB_HEARTBEAT_PULSE", "mode": mode, "times": times}
    injector = Injector({**plan, "fired": str(fired)})
    monkeypatch.setattr(Pulse, "connect", pulse_faults.faulty_connect(injector, Pulse.connect))
    row = {"id": "pulse-faults", "host": "h", "pid": os.getpid(), "queues": '["*"]'}
    row |= {"concurrency": 1, "tasks": "[]"}
    config = {"connection": psycopg_params("default"), "interval": 0.2, "worker_row": row}
    config |= {"heartbeat": JOB_HEARTBEAT_PULSE, "worker_upsert": WORKER_UPSERT}
    config |= {"parent": os.getppid()}
    pulse = Pulse(config, io.StringIO())
    pulse.leases = {ours.id: 1}
    said: list[str] = []

    def recovered() -> bool:
        said.append(capsys.readouterr().err)
        if times > 1:  # the beat after the failed one went through
            return "beats again" in "".join(said)
        return fired.exists() and job_row(ours).heartbeat_at > ours.heartbeat_at

    thread = threading.Thread(target=pulse.run, daemon=True)
    thread.start()
    try:
        wait_until(recovered, timeout=15, message="a beat through after the faults")
    finally:
        pulse.eof.set()
        thread.join(10)
        pulse.close()
    said.append(capsys.readouterr().err)
    text = "".join(said)
    assert text.count("beat failed: pgjobs fault injection") == (1 if times > 1 else 0), text
    assert len(fired.read_text().splitlines()) == times
    assert job_row(ours).heartbeat_at > ours.heartbeat_at
    assert WorkerRow.objects.filter(id="pulse-faults").exists()


def test_the_process_is_due_late_intervals_after_the_beat_began() -> None:
    """Due LATE intervals after the worker's beat began (not after its report came);
    every interval once it beats in the worker's stead; an empty set still counts."""
    pulse = Pulse({"interval": 2.0, "parent": 1}, None)
    now = time.monotonic()
    pulse.read(io.StringIO(f"= @{now - 2.9:.6f} \n"))  # 1.45 intervals ago
    assert pulse.leases == {} and not pulse.due()
    pulse.read(io.StringIO(f"= @{now - 3.1:.6f} \n"))  # 1.55 intervals ago
    assert pulse.due()
    pulse.read(io.StringIO(f"= @{now + 60:.6f} \n"))  # a clock ahead counts as now
    assert pulse.last <= time.monotonic() and not pulse.due()
    pulse.last = time.monotonic() - 2.1  # its own beat, 1.05 intervals ago
    assert pulse.due()


def test_a_stopped_process_is_seen_stopped() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not stopped(sleeper.pid)
        sleeper.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(sleeper.pid), timeout=10, message="state T")
        sleeper.send_signal(signal.SIGCONT)
        wait_until(lambda: not stopped(sleeper.pid), timeout=10, message="running again")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not stopped(sleeper.pid)  # gone: not stopped


@pytest.mark.parametrize(
    ("age", "bound", "kept"),
    [(0.5, 600.0, True), (0.5, None, True), (3600.0, 600.0, False), (0.5, 0.0, False)],
)
def test_the_health_file_is_kept_fresh_only_if_it_was(
    tmp_path: Path, age: float, bound: float | None, kept: bool
) -> None:
    """A file the worker had let go stale (stuck slots) stays stale; none is kept fresh
    past ``HEALTH_STUCK_AFTER`` of silence."""
    path = tmp_path / "alive"
    path.touch()
    then = time.time() - age
    os.utime(path, (then, then))
    pulse = Pulse({"interval": 0.5, "parent": 1, "touch": str(path), "touch_for": bound}, None)
    pulse.touch()
    assert (path.stat().st_mtime > then + age / 2) is kept
