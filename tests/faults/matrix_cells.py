"""The statement x fault matrix's cells: one runner per kind of row (``Row.kind``),
each setting up its processes around a ``Scenario`` and returning the invariants'
verdicts; ``run_cell`` picks the runner."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from typing import Any

from tests.conftest import WorkerProcess, wait_until
from tests.faults.matrix import Scenario
from tests.faults.matrix_rows import (
    ASYNC_SLEEP,
    CANCELS_ALL,
    GIL_HOLD,
    HONOUR_WINDOW,
    LISTENER_POLL,
    NOOP,
    NOTIFY_DEADLINE,
    PAUSED,
    PERIODIC_DEADLINE,
    PROPAGATION,
    PULSE_STALE_AFTER,
    STEP,
    SUSPECT_SETTLE_DEADLINE,
)


def run_worker_cell(s: Scenario) -> dict[str, str]:
    s.standard_workload()
    unknown = s.flow_setup()
    s.write_plan()
    settings = "tests.settings"
    env: dict[str, str] = dict(s.row.env)
    if s.row.kind == "cron":
        settings = "tests.cron_settings"
        env["PGJOBS_TEST_CRON"] = json.dumps(
            {"fault-tick": {"task": STEP, "schedule": "* * * * * *", "args": []}}
        )
    worker = s.start_worker(*s.row.args, settings=settings, **env)
    # A lost reply (ambiguous) may leave a job claimed that its worker never heard of:
    # reclaimed after STALE_AFTER, it then runs as a suspect in a child process, a
    # Python start-up, like the suspect-crash cells' (on a loaded CI box, once past
    # SETTLE_DEADLINE: "claim known tasks, one queue x ambiguous", 14.5 s).
    slow = s.row.setup == "suspect_crash" or s.mode == "ambiguous"
    settled = s.settle(**({"timeout": SUSPECT_SETTLE_DEADLINE} if slow else {}))
    if not settled:
        s.notes.append("workload did not settle")
    if s.row.periodic:
        # Its pass runs every few seconds (the statistics pass every 5 s, and the first
        # one within a second of the start, which a loaded box may delay past the
        # workload's end): wait for it. Not firing is then reported by "fired".
        # One job more first, claimed with every slot free: a claim that takes fewer
        # jobs than it asked for gives the claim front its bound, which its probe needs
        # (the workload's claims, each asking for the slots free then, may all have been
        # filled: CI once saw the probe never issued).
        # A priority of the workload's (a ninth level would pass ClaimFront.MAX_LEVELS
        # and end the level claims those cells wait for), and no NOTIFY (one without a
        # priority makes the claims take every level until one sees its job): the
        # worker's poll claims it.
        s.completes_within(s.insert(STEP, priority=50), PERIODIC_DEADLINE)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: s.fired(), timeout=PERIODIC_DEADLINE, message="the pass")
    slots = s.slots_back()
    fresh = s.fresh_job_completes()
    stop(s, worker)
    if unknown is not None:
        # Never run by a worker that does not know it; the sweeper may dead-letter it.
        s.expected[unknown] = ("pending", "dead")
    return s.check(not_wedged=fresh, extra={"slots_back": slots})


def run_timeout_cell(s: Scenario) -> dict[str, str]:
    """A run longer than its timeout: the worker gives it up (lease bumped) twice."""
    job = s.insert(STEP, kwargs={"hold": 1.0}, max_attempts=2, allowed=("dead",))
    s.db.execute("UPDATE django_pgjobs_job SET timeout = 0.3 WHERE id = %s", [job])
    return _run_simple_worker_cell(s)


def run_foreign_cancel_cell(s: Scenario) -> dict[str, str]:
    """An async neighbour running when another async job cancels every task of the
    loop: the neighbour's run is given back (the faulted JOB_RELEASE, by the
    completer) and runs again, its attempt not counted; the canceller is charged."""
    neighbour = s.insert(ASYNC_SLEEP, priority=50, kwargs={"seconds": 2.0}, max_attempts=1)
    s.insert(CANCELS_ALL, priority=40, max_attempts=1, allowed=("dead",))
    s.write_plan()
    result = _settle_and_check(s, s.start_worker())
    row = s.db.execute(
        "SELECT status, attempts, errors FROM django_pgjobs_job WHERE id = %s", [neighbour]
    ).fetchone()
    # max_attempts 1: a charged attempt would have dead-lettered it.
    if row is None or tuple(row) != ("completed", 1, []):
        charged = f"neighbour {neighbour} (status, attempts, errors) = {row}"
        result["not_lost"] = (
            charged if result["not_lost"] == "ok" else f"{result['not_lost']}; {charged}"
        )
    return result


def run_held_timeout_cell(s: Scenario) -> dict[str, str]:
    """A keyed run (limit 1) longer than its timeout, twice, and a job of the same key
    behind it: each abandoned thread keeps the key's slot until it ends, then the
    worker gives the slot back."""
    job = s.keyed(s.insert(STEP, kwargs={"hold": 1.0}, max_attempts=2, allowed=("dead",)))
    s.db.execute("UPDATE django_pgjobs_job SET timeout = 0.3 WHERE id = %s", [job])
    s.keyed(s.insert(STEP, kwargs={"hold": 0.2}))
    return _run_simple_worker_cell(s, **dict(s.row.env))


def run_held_cancel_cell(s: Scenario) -> dict[str, str]:
    """cancel_jobs on a running keyed job (limit 1) with a job of the same key waiting:
    the cancel holds the run's slot in its own statement; the worker gives it back when
    the run ends (its completion fenced), and only then does the next job start."""
    # Running until the driver process (Django start-up: seconds on a loaded box)
    # cancels it, then a moment more (its heartbeat tells it the lease is lost): the
    # slot stays held until the thread ends. Fixed holds (5 s, then 10 s) ended before
    # the cancel on a loaded CI box (the cancel then had nothing to do), so the run
    # holds until the driver has returned (``release``, at most 60 s); where the fault
    # made the cancel fail, the release file ends the run and it completes.
    release = s.tmp / "release"
    first = s.keyed(
        s.insert(
            STEP,
            kwargs={"hold": 60.0, "until_cancelled": True, "until_file": str(release)},
            allowed=("cancelled", "completed"),
        )
    )
    s.fence_expected.add(first)
    s.write_plan()
    worker = s.start_worker(plan=s.clean_plan(), **dict(s.row.env))
    wait_until(lambda: s.started(first), timeout=20, message="the keyed job started")
    s.keyed(s.insert(STEP, kwargs={"hold": 0.2}))
    s.driver_result = s.run_driver(s.row.action, {"ids": [first]}, s.plan_path)
    release.touch()
    s.notes.append(f"driver: {s.driver_result}")
    return _settle_and_check(s, worker)


def run_exhausted_cell(s: Scenario) -> dict[str, str]:
    """A pending row whose attempts are used up (an older version, or by hand): the
    claim fails on the CHECK, and the worker dead-letters the row."""
    s.insert(
        STEP, max_attempts=1, allowed=("dead",), extra="'pending', 1, 1, NULL, NULL, NULL, NULL"
    )
    s.insert(STEP)
    return _run_simple_worker_cell(s)


def _run_simple_worker_cell(s: Scenario, **env: str) -> dict[str, str]:
    s.write_plan()
    return _settle_and_check(s, s.start_worker(**env))


def _settle_and_check(s: Scenario, worker: WorkerProcess) -> dict[str, str]:
    """Settle; while the worker still runs, its held slots go back and a fresh job
    completes; then stop it and check the invariants."""
    if not s.settle():
        s.notes.append("workload did not settle")
    slots = s.slots_back()
    fresh = s.fresh_job_completes()
    stop(s, worker)
    return s.check(not_wedged=fresh, extra={"slots_back": slots})


def stop_then_settle(s: Scenario, worker: WorkerProcess) -> dict[str, str]:
    """The shutdown cells' end: SIGTERM the faulted worker, let a clean one finish what
    is left, check the invariants."""
    worker.signal(15)
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        s.notes.append("worker did not exit on SIGTERM")
    clean = s.start_worker(plan=s.clean_plan())
    s.settle()
    fresh = s.fresh_job_completes()
    stop(s, clean)
    return s.check(not_wedged=fresh)


def run_shutdown_cell(s: Scenario) -> dict[str, str]:
    job = s.insert(STEP, kwargs={"hold": 3.0})
    s.write_plan()
    worker = s.start_worker(PGJOBS_TEST_SHUTDOWN_TIMEOUT="0.3")
    wait_until(
        lambda: (
            s.db.execute("SELECT count(*) FROM fault_effects WHERE job_id = %s", [job]).fetchone()[
                0
            ]
            > 0
        ),
        timeout=20,
        message="job started",
    )
    return stop_then_settle(s, worker)


def run_shutdown_ahead_cell(s: Scenario) -> dict[str, str]:
    """Jobs claimed ahead of the worker's one thread, given back together at a stop:
    no-op jobs first (the worker observes a job time of microseconds, so its next claim
    takes more than the free thread), then a job that holds the thread, then the ones
    claimed ahead."""
    for _ in range(3):
        s.insert(NOOP, priority=50)
    holder = s.insert(STEP, priority=40, kwargs={"hold": 3.0})
    ahead = [s.insert(STEP, priority=30) for _ in range(5)]
    s.write_plan()
    worker = s.start_worker(PGJOBS_TEST_SHUTDOWN_TIMEOUT="0.3")

    def claimed_ahead() -> bool:
        # Two or more claimed ahead is a release of many. How many the worker claims
        # beyond its one thread follows the job time it observed: on a loaded box the
        # no-op jobs take longer, and it may claim fewer than all five.
        started = s.db.execute(
            "SELECT count(*) FROM fault_effects WHERE job_id = %s", [holder]
        ).fetchone()[0]
        running = s.db.execute(
            "SELECT count(*) FROM django_pgjobs_job WHERE id = ANY(%s) AND status = 'running'",
            [ahead],
        ).fetchone()[0]
        return bool(started) and running >= 2

    wait_until(claimed_ahead, timeout=20, message="the holder running, the rest claimed ahead")
    return stop_then_settle(s, worker)


def stop(s: Scenario, *workers: WorkerProcess) -> None:
    """SIGTERM each (at once: they shut down side by side) and wait: every signal is
    sent before the invariants are read."""
    for worker in workers:
        worker.signal(15)
    for worker in workers:
        try:
            rc = worker.wait(timeout=20)
            if rc != 0:
                s.notes.append(f"worker exit code {rc}")
        except subprocess.TimeoutExpired:
            s.notes.append("worker did not exit on SIGTERM")


def run_driver_cell(s: Scenario) -> dict[str, str]:
    action = s.row.action
    arg: dict[str, Any] = {}
    if action in (
        "enqueue",
        "enqueue_delayed",
        "enqueue_unique",
        "enqueue_unique_delayed",
        "enqueue_twice",
    ):
        arg = {"key": "driver-key"}
    elif action == "enqueue_many":
        arg = {"n": 3}
    elif action == "enqueue_many_batches":
        action, arg = "enqueue_many", {"n": 5, "batch": 2}
    elif action in ("cancel_selected", "cancel_command"):
        arg = {"ids": [s.insert(STEP, allowed=("cancelled", "completed"))]}
    elif action in ("retry_selected", "retry_command"):
        dead = s.insert(
            STEP, allowed=("completed", "dead"), extra="'dead', 5, 3, 'ghost', now(), now(), now()"
        )
        arg = {"ids": [dead]}
    elif action == "wake_selected":
        # waiting for two seconds: woken now, or (the wake failed) by the wake pass
        waiting = s.insert(STEP, extra="'waiting', 0, 1, 'ghost', now(), now(), NULL")
        s.db.execute(
            "UPDATE django_pgjobs_job SET run_at = now() + interval '2 seconds' WHERE id = %s",
            [waiting],
        )
        arg = {"ids": [waiting]}
    elif action == "send_signal":
        arg = {"id": s.insert(STEP, allowed=("completed",)), "key": "hook-1"}
    elif action == "run_jobs":
        s.insert(STEP, priority=50)
        s.insert(STEP, priority=40, kwargs={"mode": "raise"})
        s.insert(STEP, priority=30, kwargs={"mode": "discard"}, allowed=("dead", "completed"))
    elif action == "admin_pages":
        job = s.insert(STEP, allowed=("completed",))
        # a run for the workflow pages (its graph, progress and node table)
        run = s.db.execute(
            "INSERT INTO django_pgjobs_workflow (name, kind) VALUES ('pages', 'group') RETURNING id"
        ).fetchone()[0]
        s.db.execute("UPDATE django_pgjobs_job SET workflow_id = %s WHERE id = %s", [run, job])
        # a queue's page, which reads its busiest fair keys
        s.db.execute(
            "INSERT INTO django_pgjobs_queue (name, paused, updated_at)"
            " VALUES ('default', false, now()) ON CONFLICT (name) DO NOTHING"
        )
        arg = {
            "paths": [
                "/admin/django_pgjobs/job/",
                f"/admin/django_pgjobs/job/{job}/change/",
                "/admin/django_pgjobs/job/overview/",
                "/admin/django_pgjobs/job/?status__exact=dead",
                "/admin/django_pgjobs/workflow/",
                f"/admin/django_pgjobs/workflow/{run}/change/",
                "/admin/django_pgjobs/queue/default/change/",
            ]
        }
    else:
        s.insert(STEP, allowed=("completed",))
    s.write_plan()
    s.driver_result = s.run_driver(action, arg, s.plan_path)
    s.notes.append(f"driver: {s.driver_result}")
    # Every row the client was told about must exist; then a clean worker drains.
    for job_id in [s.driver_result.get("id"), *s.driver_result.get("ids", [])]:
        if job_id:
            s.expected[int(job_id)] = ("completed",)
    for job_id in s.driver_result.get("retried", []):
        # the workflow admin's retry: retried and run, or (the retry failed) left as it was
        s.expected[int(job_id)] = ("completed", "dead", "cancelled")
    if action == "retry_child_after_parent":
        # both retried (each post made again once), run in order: the child once, after
        # its parent completed ("released")
        s.expected[int(s.driver_result["parent"])] = ("completed",)
        s.expected[int(s.driver_result["child"])] = ("completed",)
        s.callbacks.append(int(s.driver_result["child"]))
    for job_id in s.driver_result.get("cancelled", []):
        # cancelled, or (the cancel failed twice) run to completion by the clean worker
        s.expected[int(job_id)] = ("cancelled", "completed")
    if action in ("batch", "batch_empty") or action == "enqueue_workflow":
        # members and callbacks of the batch, nodes of a duplicated workflow
        for (job_id,) in s.db.execute(
            "SELECT id FROM django_pgjobs_job WHERE workflow_id IS NOT NULL"
        ).fetchall():
            s.expected.setdefault(job_id, ("completed",))
    extra: dict[str, str] = {}
    if action.startswith("enqueue"):
        for (job_id,) in s.db.execute("SELECT id FROM django_pgjobs_job").fetchall():
            s.expected.setdefault(job_id, ("completed",))
        if action == "enqueue_many":
            extra["all_or_nothing"] = _bulk_outcome(s, arg["n"])
    if action in ("send_signal", "emit_event"):
        extra["delivered"] = _delivered(s, action)
    # A batch left open (the open's COMMIT landed, its reply lost): the clean worker's
    # repair pass closes it at once, as it does an abandoned one after the grace period.
    grace = {"PGJOBS_TEST_BATCH_ABANDONED_AFTER": "0.01"} if action.startswith("batch") else {}
    clean = s.start_worker(plan=s.clean_plan(), **grace)
    s.settle()
    fresh = s.fresh_job_completes()
    stop(s, clean)
    return s.check(not_wedged=fresh, extra=extra)


def _delivered(s: Scenario, action: str) -> str:
    """send_signal: one stored signal, the one both deliveries were given; emit_event:
    the event stored once or (a retry after a lost COMMIT reply) twice."""
    result = s.driver_result
    if not result.get("ok"):
        return f"the caller was refused ({result})"
    if action == "send_signal":
        stored = [
            r[0]
            for r in s.db.execute(
                "SELECT id FROM django_pgjobs_jobsignal WHERE job_id = %s", [result["job"]]
            )
        ]
        if stored != result["signals"][:1]:
            return f"signals stored {stored}, the caller was given {result['signals']}"
        return "ok"
    count = s.db.execute("SELECT count(*) FROM django_pgjobs_jobevent").fetchone()[0]
    return "ok" if 1 <= count <= 2 else f"{count} events stored"


def _bulk_outcome(s: Scenario, n: int) -> str:
    """enqueue_many: all n rows or none, and the caller got an error (a fault fired).
    The rows are there only when the COMMIT landed (an ambiguous ``at_commit`` fault)."""
    count = s.db.execute("SELECT count(*) FROM django_pgjobs_job").fetchone()[0]
    committed = s.mode == "ambiguous" and s.row.at_commit
    problems = []
    if count != (n if committed else 0):
        problems.append(f"{count} of {n} rows exist (expected {n if committed else 0})")
    if s.driver_result.get("ok"):
        problems.append(f"the caller was told it succeeded ({s.driver_result})")
    return "ok" if not problems else "; ".join(problems)


def _queue_states(s: Scenario) -> dict[str, bool]:
    rows = dict(
        s.db.execute(
            "SELECT name, paused FROM django_pgjobs_queue WHERE name = ANY(%s)", [list(PAUSED)]
        ).fetchall()
    )
    return {name: bool(rows.get(name, False)) for name in PAUSED}


def _stays_pending(s: Scenario, job_id: int, seconds: float) -> bool:
    """True if the job is still pending after ``seconds`` (checked all along)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if s.status(job_id) != "pending":
            return False
        time.sleep(0.1)
    return s.status(job_id) == "pending"


def run_queue_cell(s: Scenario) -> dict[str, str]:
    """pause_queue / resume_queue of two queues, one attempt, with a worker running:
    both queues end in the old state (the caller got an error) or both in the new one
    (the COMMIT landed: an error too, its reply was lost); the worker honours it."""
    pausing = s.row.action == "pause"
    before = not pausing
    if s.row.setup == "rows" or not pausing:
        for name in PAUSED:
            s.db.execute(
                "INSERT INTO django_pgjobs_queue (name, paused, updated_at) VALUES (%s, %s, now())",
                [name, before],
            )
    first = s.insert(STEP)
    s.write_plan()
    worker = s.start_worker(plan=s.clean_plan())
    honoured: list[str] = []
    if before and not _stays_pending(s, first, HONOUR_WINDOW):
        honoured.append(f"job {first} of a paused queue ran")
    if not before and not s.settle():
        honoured.append(f"job {first} of an active queue did not run")
    s.driver_result = s.run_driver(s.row.action, {"names": list(PAUSED)}, s.plan_path)
    s.notes.append(f"driver: {s.driver_result}")
    states = _queue_states(s)
    committed = s.mode == "ambiguous" and s.row.at_commit
    want = (not before) if committed else before
    problems = []
    if set(states.values()) != {want}:
        problems.append(f"queues paused: {states} (expected all {want})")
    if s.driver_result.get("ok"):
        problems.append(f"the caller was told it succeeded ({s.driver_result})")
    # The committed state reaches the worker (NOTIFY, else within POLL_INTERVAL) ...
    time.sleep(PROPAGATION)
    second = s.insert(STEP)
    s.db.execute("SELECT pg_notify('pgjobs', 'default')")
    paused_now = any(states.values())
    if paused_now:
        if not _stays_pending(s, second, HONOUR_WINDOW):
            honoured.append(f"job {second} ran while its queue is paused")
        # ... and an operator's clean resume lets every job run.
        clean = s.run_driver("resume", {"names": list(PAUSED)}, s.clean_plan())
        if not clean.get("ok"):
            honoured.append(f"clean resume failed: {clean}")
    s.settle()
    fresh = s.fresh_job_completes()
    stop(s, worker)
    return s.check(
        not_wedged=fresh,
        extra={
            "all_or_nothing": "ok" if not problems else "; ".join(problems),
            "honoured": "ok" if not honoured else "; ".join(honoured),
        },
    )


def _listener_up_since(s: Scenario, since: float) -> bool:
    """A LISTEN session opened after ``since`` (unix time: the last fault) is connected
    (one opened before it and never faulted since counts too: a fault of the "wait"
    row's ambiguous kind fires only when a notification arrives)."""
    row = s.db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND query IN ('LISTEN pgjobs', 'SELECT 1')"
        " AND backend_start > to_timestamp(%s)",
        [since],
    ).fetchone()
    return bool(row and row[0])


def run_listener_cell(s: Scenario) -> dict[str, str]:
    """The LISTEN connection fails at every call of the row's kind until the cell heals
    it: meanwhile a job is still claimed (the poll, or the wake-up after each
    reconnect); after it reconnects, a NOTIFY wakes the worker long before its poll."""
    s.write_plan()
    worker = s.start_worker("--poll-interval", str(LISTENER_POLL))
    broken: list[str] = []
    # A job while the listener fails (its NOTIFY is what the "wait" row's ambiguous
    # fault loses with the connection).
    wait_until(
        lambda: s.db.execute("SELECT count(*) FROM django_pgjobs_worker").fetchone()[0] > 0,
        timeout=20,
        message="worker registered",
    )
    during = s.insert(STEP)

    def notified_and_fired() -> bool:
        # A NOTIFY sent before the listener's first LISTEN reaches nobody: repeat it
        # until the fault fired (the "wait" row's ambiguous fault needs one to arrive).
        s.db.execute("SELECT pg_notify('pgjobs', 'default')")
        return bool(s.fired())

    with contextlib.suppress(AssertionError):  # reported by the "fired" invariant
        wait_until(notified_and_fired, timeout=10, interval=0.2, message="fault fired")
    if not s.completes_within(during, LISTENER_POLL * 1.2 + 3):
        broken.append(f"job {during} did not run while the LISTEN connection failed")
    s.heal_path.touch()
    # The last fault fired before the heal; the listener must be connected after it.
    last_fault = max([f.get("at", 0.0) for f in s.fired()], default=time.time())
    try:
        wait_until(
            lambda: _listener_up_since(s, last_fault), timeout=15, message="listener reconnected"
        )
    except AssertionError:
        broken.append("the listener did not reconnect within 15 s of the fault's end")
    # After a job completes the claim loop claims once more (a slot was freed) and
    # then sleeps a whole poll interval (>= 0.8 x LISTENER_POLL): a job inserted
    # shortly after, completed within NOTIFY_DEADLINE, was woken by its NOTIFY.
    after = s.insert(STEP)
    s.db.execute("SELECT pg_notify('pgjobs', 'default')")
    if not s.completes_within(after, LISTENER_POLL * 1.2 + 3):
        broken.append(f"job {after} did not run after the listener recovered")
    time.sleep(0.5)  # past the claim of the freed slot, well before the next poll
    woken = s.insert(STEP)
    s.db.execute("SELECT pg_notify('pgjobs', 'default')")
    if not s.completes_within(woken, NOTIFY_DEADLINE):
        broken.append(f"job {woken} was not woken by its NOTIFY within {NOTIFY_DEADLINE} s")
    fresh = s.fresh_job_completes()
    stop(s, worker)
    return s.check(not_wedged=fresh, extra={"listener": "ok" if not broken else "; ".join(broken)})


def run_pulse_cell(s: Scenario) -> dict[str, str]:
    """A job holds the GIL in one C call past STALE_AFTER, so only the worker's
    heartbeat process beats for it, and that process's statement fails once: it closes
    its connection, reconnects and beats again at once (django_pgjobs/pulse.py). A
    second worker, of another queue (it never claims the job), reaps all along: had
    the job's heartbeat gone stale, it would reclaim the job from its live worker."""
    s.write_plan()
    env = {"PGJOBS_TEST_STALE_AFTER": str(PULSE_STALE_AFTER)}
    watcher = s.start_worker("--queues", "other", plan=s.clean_plan(), **env)
    worker = s.start_worker(**env)
    query = "SELECT count(*) FROM django_pgjobs_worker WHERE pid = ANY(%s)"
    pids = [watcher.pid, worker.pid]
    wait_until(
        lambda: s.db.execute(query, [pids]).fetchone()[0] == 2,
        timeout=30,
        message="both workers registered (the watcher's reaper runs)",
    )
    job = s.insert(STEP, kwargs={"hold": GIL_HOLD, "gil": True})
    s.db.execute("SELECT pg_notify('pgjobs', 'default')")
    if not s.settle():
        s.notes.append("workload did not settle")
    alive = _kept_alive(s, job)
    fresh = s.fresh_job_completes()
    stop(s, worker, watcher)
    return s.check(not_wedged=fresh, extra={"kept_alive": alive})


def _kept_alive(s: Scenario, job: int) -> str:
    """The "kept_alive" invariant: completed on its first claim, one run, which held
    the GIL past STALE_AFTER, and the fault fired while it did."""
    row = s.db.execute(
        "SELECT status, attempts, lease FROM django_pgjobs_job WHERE id = %s", [job]
    ).fetchone()
    problems = []
    if row is None or tuple(row) != ("completed", 1, 1):
        problems.append(f"job {job} (status, attempts, lease) = {row}, not (completed, 1, 1)")
    effects = s.db.execute(
        "SELECT phase, extract(epoch FROM at)::float8 FROM fault_effects WHERE job_id = %s",
        [job],
    ).fetchall()
    starts = [at for phase, at in effects if phase == "start"]
    ends = [at for phase, at in effects if phase == "end"]
    if len(starts) != 1 or len(ends) != 1:
        problems.append(f"job {job}: {len(starts)} runs started, {len(ends)} ended (not 1)")
    else:
        if ends[0] - starts[0] < PULSE_STALE_AFTER + 1:
            problems.append(f"the GIL was held {ends[0] - starts[0]:.1f}s only")
        if not any(starts[0] <= f["at"] <= ends[0] for f in s.fired()):
            problems.append("the fault did not fire while the job held the GIL")
    return "ok" if not problems else "; ".join(problems)


def run_cell(s: Scenario) -> dict[str, str]:
    runner = {
        "worker": run_worker_cell,
        "cron": run_worker_cell,
        "shutdown": run_shutdown_cell,
        "shutdown_ahead": run_shutdown_ahead_cell,
        "foreign_cancel": run_foreign_cancel_cell,
        "driver": run_driver_cell,
        "timeout": run_timeout_cell,
        "held_timeout": run_held_timeout_cell,
        "held_cancel": run_held_cancel_cell,
        "exhausted": run_exhausted_cell,
        "queue": run_queue_cell,
        "listener": run_listener_cell,
        "pulse": run_pulse_cell,
    }[s.row.kind]
    started = time.monotonic()
    result = runner(s)
    s.notes.append(f"{time.monotonic() - started:.1f}s")
    return result
