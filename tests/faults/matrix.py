"""The statement x fault matrix: rows (a statement as one caller issues it), the
workloads that make each caller issue it, and the invariants checked afterwards.

Every scenario runs real processes on the fault suite's cluster: ``runjobs``
subprocesses (worker, reaper, pruner, cron ticker) or the driver
(``tests/faults/driver.py``: enqueue, admin, jobs_status, ``testing.run_jobs``),
with the injector of ``tests/faults/injector.py`` installed through
``$PGJOBS_FAULT_PLAN``. Short timings (heartbeat 0.5 s, stale after 2 s,
concurrency 1 so completion batches hold one job each) keep a cell to seconds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import ROOT, WorkerProcess, wait_until
from tests.faults.conftest import Workers, django_env

STEP = "tests.testapp.jobs.fault_step"
ATOMIC = "tests.testapp.jobs.fault_atomic"
UNKNOWN = "tests.faults.not_in_this_release"
KEYED = "tests.flow_keyed_jobs.per_user"
FINAL = ("completed", "dead", "cancelled")
#: A fresh job must complete within this after a scenario (the queue is not wedged).
FRESH_DEADLINE = 10.0
SETTLE_DEADLINE = 12.0

INVARIANTS = (
    ("fired", "the fault was injected"),
    ("not_lost", "no committed job lost"),
    ("once", "none completed twice"),
    ("bounded", "no job pending with attempts above its bound"),
    ("not_wedged", "no queue wedged (a fresh job completes)"),
    ("no_false_fence", "no false job_fenced"),
    ("one_success_signal", "every completed job got exactly one success signal"),
    (
        "all_or_nothing",
        "enqueue_many and pause/resume: every row written or none, and the caller got an"
        " error (the rows are there, once, only when the COMMIT landed)",
    ),
    (
        "honoured",
        "pause/resume: workers honour the committed state (a job of a paused queue waits,"
        " of a resumed one runs)",
    ),
    (
        "listener",
        "LISTEN connection: the worker claims while it fails, and a NOTIFY wakes the worker"
        " again once it recovered",
    ),
)
#: The queues a pause/resume cell changes in one call (a half-written call would
#: leave them different).
PAUSED = ("default", "other")
#: The listener cells' poll interval: long enough that a job completing within
#: NOTIFY_DEADLINE of its NOTIFY was woken by it, not by the poll.
LISTENER_POLL = 4.0
NOTIFY_DEADLINE = 1.5
#: A pause or resume reaches the workers at once by NOTIFY, else within POLL_INTERVAL.
PROPAGATION = 1.0
HONOUR_WINDOW = 1.5


@dataclass(frozen=True)
class Row:
    """One statement as one caller issues it."""

    label: str
    # "sql.NAME", "skew.NAME", "copy:job", "listener:...", "orm:VERB table*" (a
    # pattern: every shape of that verb on that table) or "*read" (every read)
    statement: str
    kind: str  # worker | shutdown | cron | driver | timeout | exhausted | queue | listener
    skip: int = 0  # matching calls let through before the fault
    args: tuple[str, ...] = ()
    action: str = ""  # driver action
    times: int = 1
    django6: bool = False  # the Tasks backend: Django >= 6.0 only
    linger: float = 0.0  # ambiguous: seconds between the commit and the error
    setup: str = ""  # flow workload: unknown | unknown_dead | max_running | rate | keyed
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the faulted worker
    # ambiguous inside a transaction: the COMMIT lands and its reply is lost (instead
    # of the connection dropping before the COMMIT)
    at_commit: bool = False

    @property
    def id(self) -> str:
        return self.label.replace(" ", "-").replace(":", "").replace("(", "").replace(")", "")


ROWS: tuple[Row, ...] = (
    # A worker of every queue reads the queues with pending jobs, then claims from
    # them by name (JOB_CLAIM_ONE_QUEUE here: the workload has one queue).
    Row("worker: find the queues with pending jobs", "sql.PENDING_QUEUES", "worker"),
    Row("worker: claim, every queue", "sql.JOB_CLAIM_ONE_QUEUE", "worker"),
    Row(
        "worker: claim, one queue",
        "sql.JOB_CLAIM_ONE_QUEUE",
        "worker",
        args=("--queues", "default"),
    ),
    Row(
        "worker: claim, several queues",
        "sql.JOB_CLAIM_QUEUES",
        "worker",
        args=("--queues", "default,other"),
    ),
    Row(
        "worker: complete (atomic job, in its transaction)",
        "sql.JOB_COMPLETE_MANY_REDO",
        "worker",
    ),
    # The completer's first try; after a fault it redoes the batch with the _REDO form.
    Row("worker: complete (completer)", "sql.JOB_COMPLETE_MANY", "worker", skip=1),
    Row("worker: stored result of a key", "sql.RESULT_BY_KEY", "worker"),
    # The reply is lost for 1.5 s: long enough for the retried job to be claimed again
    # before the completer redoes its write (a longer outage does the same).
    Row("worker: retry (reply lost for 1.5 s)", "sql.JOB_RETRY", "worker", linger=1.5),
    Row("worker: dead-letter", "sql.JOB_DEAD", "worker"),
    # Flow control (flow.py): after a job of a task it does not know (deploy skew) a
    # worker claims with the known-task filter; a queue row with a limit, or a loaded
    # task with a concurrency key, makes it take FLOW_LOCK and the limited claim.
    Row(
        "worker: claim known tasks, every queue",
        "sql.JOB_CLAIM_ONE_QUEUE_KNOWN",  # by name, from sql.PENDING_QUEUES
        "worker",
        setup="unknown",
    ),
    Row(
        "worker: claim known tasks, one queue",
        "sql.JOB_CLAIM_ONE_QUEUE_KNOWN",
        "worker",
        args=("--queues", "default"),
        setup="unknown",
    ),
    Row(
        "worker: claim known tasks, several queues",
        "sql.JOB_CLAIM_QUEUES_KNOWN",
        "worker",
        args=("--queues", "default,other"),
        setup="unknown",
    ),
    Row(
        "worker: limited claim, every queue (max_running)",
        "sql.JOB_CLAIM_LIMITED_ALL",
        "worker",
        setup="max_running",
    ),
    Row(
        "worker: limited claim, every queue (keyed job)",
        "sql.JOB_CLAIM_LIMITED_ALL",
        "worker",
        setup="keyed",
        env=(("PGJOBS_TEST_KEYED", "1"),),
    ),
    Row(
        "worker: limited claim, listed queues (rate)",
        "sql.JOB_CLAIM_LIMITED_QUEUES",
        "worker",
        args=("--queues", "default,other"),
        setup="rate",
    ),
    Row("worker: limited claim's advisory lock", "sql.FLOW_LOCK", "worker", setup="max_running"),
    Row("worker: read the queue limits", "sql.QUEUE_LIMITS", "worker", setup="max_running"),
    Row("worker: heartbeat", "sql.JOB_HEARTBEAT", "worker"),
    Row("worker: register", "sql.WORKER_UPSERT", "worker"),
    Row("worker: worker row refresh", "sql.WORKER_UPSERT", "worker", skip=1),
    Row("worker: unregister at exit", "sql.WORKER_DELETE", "worker"),
    Row("worker: release at shutdown", "sql.JOB_RELEASE", "shutdown"),
    Row("worker: give up a timed-out run", "sql.JOB_TIMED_OUT", "timeout"),
    Row("worker: dead-letter rows with no attempts left", "sql.JOB_DEAD_EXHAUSTED", "exhausted"),
    Row("unknown-task sweeper: record known tasks", "skew.KNOWN_TASKS_TOUCH", "worker"),
    Row(
        "unknown-task sweeper: dead-letter (timeout 1 s)",
        "skew.JOB_DEAD_UNKNOWN",
        "worker",
        setup="unknown_dead",
        env=(("PGJOBS_TEST_UNKNOWN_TASK_TIMEOUT", "1"),),
    ),
    Row("reaper: reclaim stale", "sql.JOB_REAP_STALE", "worker"),
    Row("reaper: forget stale workers", "sql.WORKER_FORGET_STALE", "worker"),
    Row("pruner: delete a batch", "sql.JOB_PRUNE_BATCH", "worker"),
    Row("cron ticker: enqueue a fire time", "sql.JOB_INSERT", "cron"),
    Row("enqueue (retried once by the caller)", "sql.JOB_INSERT", "driver", action="enqueue"),
    Row(
        "enqueue with a delay (retried once)",
        "sql.JOB_INSERT_DELAYED",
        "driver",
        action="enqueue_delayed",
    ),
    Row(
        "enqueue unique_while (retried once)",
        "sql.JOB_INSERT_FLOW",
        "driver",
        action="enqueue_unique",
    ),
    Row(
        "enqueue unique_while with a delay (retried once)",
        "sql.JOB_INSERT_FLOW_DELAYED",
        "driver",
        action="enqueue_unique_delayed",
    ),
    Row("enqueue: existing key", "sql.JOB_BY_KEY", "driver", action="enqueue_twice"),
    Row("enqueue_many: notify after COPY", "sql.JOB_NOTIFY", "driver", action="enqueue_many"),
    # The COPY runs through the connection's execute_wrappers (enqueue._copy_rows).
    Row(
        "enqueue_many: COPY (reply to COMMIT lost)",
        "copy:job",
        "driver",
        action="enqueue_many",
        at_commit=True,
    ),
    Row(
        "enqueue_many: 2nd of 3 COPY batches (reply to COMMIT lost)",
        "copy:job",
        "driver",
        action="enqueue_many_batches",
        skip=1,
        at_commit=True,
    ),
    # pause_queue / resume_queue of two queues in one call (flow.py; the management
    # commands and the queue admin's actions call these): ORM rows name a pattern.
    Row(
        "pause_queue: lock a queue row (SELECT FOR UPDATE)",
        "orm:SELECT queue*",
        "queue",
        action="pause",
        setup="rows",
        at_commit=True,
    ),
    Row(
        "pause_queue: create the 2nd queue row",
        "orm:INSERT queue*",
        "queue",
        action="pause",
        skip=1,
        at_commit=True,
    ),
    Row(
        "pause_queue: update the 2nd queue row",
        "orm:UPDATE queue*",
        "queue",
        action="pause",
        setup="rows",
        skip=1,
        at_commit=True,
    ),
    Row(
        "pause_queue: queue-change notify",
        "sql.JOB_NOTIFY",
        "queue",
        action="pause",
        setup="rows",
        at_commit=True,
    ),
    Row(
        "resume_queue: update a queue row",
        "orm:UPDATE queue*",
        "queue",
        action="resume",
        at_commit=True,
    ),
    Row(
        "resume_queue: wake the 2nd queue's workers",
        "sql.JOB_NOTIFY",
        "queue",
        action="resume",
        skip=2,
        at_commit=True,
    ),
    # The worker's LISTEN connection (worker/listener.py), failing over and over for a
    # while (until the cell heals it).
    Row("listener: LISTEN", "listener:LISTEN", "listener"),
    Row("listener: wait for notifications", "listener:wait", "listener"),
    Row("listener: keep-alive", "listener:keep-alive", "listener"),
    # Fails resume_queue's first notify (pause_queue's is let through): a queue left
    # paused would leave the fresh job pending.
    Row(
        "resume_queue (retried once): queue-change notify",
        "sql.JOB_NOTIFY",
        "driver",
        action="pause_resume",
        skip=1,
    ),
    Row("admin: cancel", "sql.JOB_CANCEL", "driver", action="cancel_selected"),
    Row("admin: retry", "sql.JOB_RETRY_NOW", "driver", action="retry_selected"),
    Row(
        "admin: retry's lock on unique keys",
        "sql.RETRY_KEY_LOCK",
        "driver",
        action="retry_selected",
        at_commit=True,
    ),
    Row("admin: cancel, every read", "*read", "driver", action="cancel_selected", times=0),
    Row("admin: retry, every read", "*read", "driver", action="retry_selected", times=0),
    Row("cancel_jobs: cancel", "sql.JOB_CANCEL", "driver", action="cancel_command"),
    Row("cancel_jobs: every read", "*read", "driver", action="cancel_command", times=0),
    Row("retry_jobs: retry", "sql.JOB_RETRY_NOW", "driver", action="retry_command"),
    Row("retry_jobs: every read", "*read", "driver", action="retry_command", times=0),
    Row("run_jobs: claim", "sql.JOB_CLAIM_ALL_KNOWN", "driver", action="run_jobs"),
    Row("run_jobs: complete", "sql.JOB_COMPLETE_MANY_REDO", "driver", action="run_jobs"),
    Row("run_jobs: retry", "sql.JOB_RETRY", "driver", action="run_jobs"),
    Row("run_jobs: dead-letter", "sql.JOB_DEAD", "driver", action="run_jobs"),
    Row("run_jobs: every read", "*read", "driver", action="run_jobs", times=0),
    Row(
        "Tasks backend: enqueue (retried once)",
        "sql.JOB_INSERT",
        "driver",
        action="tasks_enqueue",
        django6=True,
    ),
    Row(
        "Tasks backend: get_result, every read",
        "*read",
        "driver",
        action="tasks_get_result",
        times=0,
        django6=True,
    ),
    Row("admin pages: every read", "*read", "driver", action="admin_pages", times=0),
    Row("jobs_status: every read", "*read", "driver", action="jobs_status", times=0),
    Row("prune --dry-run: every read", "*read", "driver", action="prune_dry_run", times=0),
)

#: Statements of sql.py no runtime caller issues (DDL of migrations, unused).
NOT_RUNTIME = {
    "sql.JOB_CLAIM_ALL": "sql.claim(queues=None) without a task filter; a worker of every"
    " queue claims by name from sql.PENDING_QUEUES instead (flow.FlowState)",
    "sql.ENQUEUE_FUNCTION": "migration DDL (0002), runs once at migrate",
    "sql.ENQUEUE_FUNCTION_DROP": "migration DDL (reverse of 0002)",
}


@dataclass
class Scenario:
    """State of one cell while it runs."""

    row: Row
    mode: str
    db: psycopg.Connection
    workers: Workers
    tmp: Path
    expected: dict[int, tuple[str, ...]] = field(default_factory=dict)
    atomic_ids: set[int] = field(default_factory=set)
    driver_result: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def plan_path(self) -> Path:
        return self.tmp / "plan.json"

    @property
    def signals_path(self) -> Path:
        return self.tmp / "signals.jsonl"

    @property
    def fired_path(self) -> Path:
        return self.tmp / "fired.jsonl"

    @property
    def heal_path(self) -> Path:
        """Listener cells: the fault repeats until this file exists."""
        return self.tmp / "heal"

    def write_plan(self) -> None:
        plan: dict[str, Any] = {
            "statement": self.row.statement,
            "mode": self.mode,
            "skip": self.row.skip,
            "times": self.row.times,
            "linger": self.row.linger,
            "at_commit": self.row.at_commit,
            "fired": str(self.fired_path),
            "signals": str(self.signals_path),
        }
        if self.row.kind == "listener":
            plan["until"] = str(self.heal_path)
        self.plan_path.write_text(json.dumps(plan))

    def clean_plan(self) -> Path:
        """A plan that only records signals (for the clean processes)."""
        path = self.tmp / "clean-plan.json"
        path.write_text(json.dumps({"signals": str(self.signals_path)}))
        return path

    # -- workloads -------------------------------------------------------------------

    def insert(
        self,
        task: str,
        *,
        kwargs: dict[str, Any] | None = None,
        priority: int = 0,
        key: str | None = None,
        max_attempts: int = 5,
        queue: str = "default",
        allowed: tuple[str, ...] = ("completed",),
        extra: str = "",
    ) -> int:
        cols = "task, args, kwargs, priority, idempotency_key, max_attempts, queue, run_at"
        vals = "%s, '[]'::jsonb, %s::jsonb, %s, %s, %s, %s, now()"
        params: list[Any] = [task, json.dumps(kwargs or {}), priority, key, max_attempts, queue]
        if extra:
            cols += ", status, attempts, lease, worker, started_at, heartbeat_at, finished_at"
            vals += f", {extra}"
        row = self.db.execute(
            f"INSERT INTO django_pgjobs_job ({cols}) VALUES ({vals}) RETURNING id", params
        ).fetchone()
        assert row is not None
        job_id = int(row[0])
        self.expected[job_id] = allowed
        if task == ATOMIC:
            self.atomic_ids.add(job_id)
        return job_id

    def standard_workload(self) -> None:
        """Jobs that make a worker issue every statement once, in priority order."""
        self.insert(ATOMIC, priority=60)
        self.insert(STEP, priority=50)
        self.insert(
            STEP, priority=40, key="fault-key", max_attempts=1, allowed=("completed", "dead")
        )
        self.insert(STEP, priority=30, kwargs={"mode": "raise"})
        # discard_on on its first attempt only: a lost first attempt may complete later.
        self.insert(STEP, priority=20, kwargs={"mode": "discard"}, allowed=("dead", "completed"))
        self.insert(STEP, priority=10, kwargs={"hold": 0.8})
        # A job whose worker vanished an hour ago (the reaper's work) ...
        self.insert(
            STEP,
            priority=0,
            extra="'running', 1, 1, 'ghost', now() - interval '1 hour',"
            " now() - interval '1 hour', NULL",
        )
        # ... and one finished long ago (the pruner's).
        old = self.insert(
            STEP,
            allowed=("completed", "gone"),
            extra="'completed', 1, 1, 'ghost', now() - interval '60 days',"
            " now() - interval '60 days', now() - interval '60 days'",
        )
        self.db.execute(
            "INSERT INTO django_pgjobs_worker (id, host, pid, queues, concurrency,"
            " started_at, last_seen) VALUES ('ghost', 'h', 1, '[\"*\"]', 1,"
            " now() - interval '1 hour', now() - interval '1 hour')"
        )
        self.notes.append(f"old completed job {old} may be pruned")

    def flow_setup(self) -> int | None:
        """The row's flow-control workload; the id of a job that stays pending, if any
        (left out of ``expected`` until the workload settled)."""
        setup = self.row.setup
        if setup == "unknown":
            # First in line: the fast-path claim takes it, gives it back uncounted, and
            # the worker switches to the known-task claims.
            job = self.insert(UNKNOWN, priority=90)
            del self.expected[job]
            return job
        if setup == "unknown_dead":
            # No live worker knows it: the sweeper dead-letters it once the worker has
            # been up for the (1 s) timeout.
            self.insert(UNKNOWN, priority=90, allowed=("dead",))
        if setup in ("max_running", "rate"):
            column, value = ("max_running", 3) if setup == "max_running" else ("rate", "100/s")
            self.db.execute(
                f"INSERT INTO django_pgjobs_queue (name, {column}, updated_at)"
                " VALUES ('default', %s, now())",
                [value],
            )
        if setup == "keyed":
            job = self.insert(
                KEYED,
                priority=55,
                queue="flow-keyed",
                kwargs={"user_id": 1, "i": 0, "seconds": 0.0},
            )
            self.db.execute(
                "UPDATE django_pgjobs_job SET concurrency_key = 'user:1',"
                " concurrency_limit = 1 WHERE id = %s",
                [job],
            )
        return None

    # -- processes -------------------------------------------------------------------

    def start_worker(
        self, *args: str, plan: Path | None = None, settings: str = "tests.settings", **env: str
    ) -> WorkerProcess:
        return self.workers.start(
            "--concurrency",
            "1",
            *args,
            PGJOBS_FAULT_PLAN=str(plan or self.plan_path),
            DJANGO_SETTINGS_MODULE=settings,
            **env,
        )

    def run_driver(self, action: str, arg: dict[str, Any], plan: Path) -> dict[str, Any]:
        env = django_env(self.workers.url, PGJOBS_FAULT_PLAN=str(plan))
        proc = subprocess.run(
            [sys.executable, "-m", "tests.faults.driver", action, json.dumps(arg)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        for line in proc.stdout.splitlines():
            if line.startswith("DRIVER-RESULT "):
                return dict(json.loads(line.removeprefix("DRIVER-RESULT ")))
        raise AssertionError(
            f"driver {action} printed no result (rc={proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )

    def settle(self, timeout: float = SETTLE_DEADLINE) -> bool:
        """Wait until every expected job is final (or pruned, where allowed)."""

        def done() -> bool:
            rows = dict(
                self.db.execute(
                    "SELECT id, status FROM django_pgjobs_job WHERE id = ANY(%s)",
                    [list(self.expected)],
                ).fetchall()
            )
            return all(rows.get(i, "gone") in (*FINAL, "gone") for i in self.expected)

        try:
            wait_until(done, timeout=timeout, interval=0.1, message="workload settled")
            return True
        except AssertionError:
            return False

    def fresh_job_completes(self) -> bool:
        job_id = self.insert(STEP, priority=100)
        self.db.execute("SELECT pg_notify('pgjobs', 'default')")
        return self.completes_within(job_id, FRESH_DEADLINE, interval=0.1)

    def completes_within(self, job_id: int, seconds: float, interval: float = 0.05) -> bool:
        try:
            wait_until(
                lambda: self.status(job_id) == "completed",
                timeout=seconds,
                interval=interval,
                message=f"job {job_id} completed",
            )
            return True
        except AssertionError:
            return False

    def status(self, job_id: int) -> str:
        row = self.db.execute(
            "SELECT status FROM django_pgjobs_job WHERE id = %s", [job_id]
        ).fetchone()
        return "gone" if row is None else str(row[0])

    def fired(self) -> list[dict[str, Any]]:
        if not self.fired_path.exists():
            return []
        return [json.loads(x) for x in self.fired_path.read_text().splitlines() if x]

    def signals(self) -> list[dict[str, Any]]:
        if not self.signals_path.exists():
            return []
        return [json.loads(x) for x in self.signals_path.read_text().splitlines() if x]

    # -- invariants ------------------------------------------------------------------

    def check(self, *, not_wedged: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Each invariant: "ok" or what broke it (``extra``: the row kind's own, the
        others of INVARIANTS are "ok" where they do not apply)."""
        out: dict[str, str] = {"all_or_nothing": "ok", "honoured": "ok", "listener": "ok"}
        out.update(extra or {})
        out["fired"] = "ok" if self.fired() else "the statement was never issued"
        rows = {
            r[0]: r
            for r in self.db.execute(
                "SELECT id, status, attempts, max_attempts, lease, task FROM django_pgjobs_job"
            )
        }
        lost = []
        for job_id, allowed in self.expected.items():
            status = rows[job_id][1] if job_id in rows else "gone"
            if status not in allowed:
                lost.append(f"{job_id}:{status} (expected {'/'.join(allowed)})")
        for job_id, row in rows.items():
            if job_id not in self.expected and row[1] not in ("completed", "pending"):
                lost.append(f"{job_id}:{row[1]}")
        out["not_lost"] = "ok" if not lost else "; ".join(lost)
        signals = self.signals()
        succeeded: dict[int, int] = {}
        for s in signals:
            if s["signal"] == "job_succeeded":
                succeeded[s["job_id"]] = succeeded.get(s["job_id"], 0) + 1
        twice = [f"{j}: {n} success signals" for j, n in succeeded.items() if n > 1]
        for job_id in self.atomic_ids:
            n = self.db.execute(
                "SELECT count(*) FROM fault_effects WHERE job_id = %s AND"
                " lease = (SELECT lease FROM django_pgjobs_job WHERE id = %s)",
                [job_id, job_id],
            ).fetchone()[0]
            total = self.db.execute(
                "SELECT count(*) FROM fault_effects WHERE job_id = %s", [job_id]
            ).fetchone()[0]
            if job_id in rows and rows[job_id][1] == "completed" and (n != 1 or total != 1):
                twice.append(f"atomic {job_id}: {total} effect rows")
        out["once"] = "ok" if not twice else "; ".join(twice)
        over = [
            f"{j}: pending {r[2]}/{r[3]}"
            for j, r in rows.items()
            if r[1] == "pending" and r[2] >= r[3]
        ]
        out["bounded"] = "ok" if not over else "; ".join(over)
        out["not_wedged"] = "ok" if not_wedged else "a fresh job did not complete in time"
        fenced = [
            f"{s['job_id']} ({s.get('write')})" for s in signals if s["signal"] == "job_fenced"
        ]
        out["no_false_fence"] = "ok" if not fenced else "job_fenced for " + ", ".join(fenced)
        missing = [
            f"{j}: {succeeded.get(j, 0)}"
            for j, r in rows.items()
            if r[1] == "completed"
            and succeeded.get(j, 0) != 1
            and not (j in self.expected and "gone" in self.expected[j])
        ]
        # Tasks jobs: task_finished(SUCCESSFUL) exactly once, and only for completed jobs.
        finished: dict[int, int] = {}
        for sig in signals:
            if sig["signal"] == "task_finished" and sig.get("status") == "SUCCESSFUL":
                finished[sig["job_id"]] = finished.get(sig["job_id"], 0) + 1
        for job_id, n in finished.items():
            status = rows[job_id][1] if job_id in rows else "gone"
            if (status == "completed") != (n == 1) or n > 1:
                missing.append(f"{job_id}: {n} task_finished(SUCCESSFUL), status {status}")
        out["one_success_signal"] = (
            "ok" if not missing else "success signals per completed job " + ", ".join(missing)
        )
        return out


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
    settled = s.settle()
    if not settled:
        s.notes.append("workload did not settle")
    fresh = s.fresh_job_completes()
    stop(s, worker)
    if unknown is not None:
        # Never run by a worker that does not know it; the sweeper may dead-letter it.
        s.expected[unknown] = ("pending", "dead")
    return s.check(not_wedged=fresh)


def run_timeout_cell(s: Scenario) -> dict[str, str]:
    """A run longer than its timeout: the worker gives it up (lease bumped) twice."""
    job = s.insert(STEP, kwargs={"hold": 1.0}, max_attempts=2, allowed=("dead",))
    s.db.execute("UPDATE django_pgjobs_job SET timeout = 0.3 WHERE id = %s", [job])
    return _run_simple_worker_cell(s)


def run_exhausted_cell(s: Scenario) -> dict[str, str]:
    """A pending row whose attempts are used up (an older version, or by hand): the
    claim fails on the CHECK, and the worker dead-letters the row."""
    s.insert(
        STEP, max_attempts=1, allowed=("dead",), extra="'pending', 1, 1, NULL, NULL, NULL, NULL"
    )
    s.insert(STEP)
    return _run_simple_worker_cell(s)


def _run_simple_worker_cell(s: Scenario) -> dict[str, str]:
    s.write_plan()
    worker = s.start_worker()
    if not s.settle():
        s.notes.append("workload did not settle")
    fresh = s.fresh_job_completes()
    stop(s, worker)
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


def stop(s: Scenario, worker: WorkerProcess) -> None:
    """SIGTERM and wait: every signal is sent before the invariants are read."""
    worker.signal(15)
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
    elif action == "run_jobs":
        s.insert(STEP, priority=50)
        s.insert(STEP, priority=40, kwargs={"mode": "raise"})
        s.insert(STEP, priority=30, kwargs={"mode": "discard"}, allowed=("dead", "completed"))
    elif action == "admin_pages":
        job = s.insert(STEP, allowed=("completed",))
        arg = {
            "paths": [
                "/admin/django_pgjobs/job/",
                f"/admin/django_pgjobs/job/{job}/change/",
                "/admin/django_pgjobs/job/overview/",
                "/admin/django_pgjobs/job/?status__exact=dead",
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
    extra: dict[str, str] = {}
    if action.startswith("enqueue"):
        for (job_id,) in s.db.execute("SELECT id FROM django_pgjobs_job").fetchall():
            s.expected.setdefault(job_id, ("completed",))
        if action == "enqueue_many":
            extra["all_or_nothing"] = _bulk_outcome(s, arg["n"])
    clean = s.start_worker(plan=s.clean_plan())
    s.settle()
    fresh = s.fresh_job_completes()
    stop(s, clean)
    return s.check(not_wedged=fresh, extra=extra)


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


def run_cell(s: Scenario) -> dict[str, str]:
    runner = {
        "worker": run_worker_cell,
        "cron": run_worker_cell,
        "shutdown": run_shutdown_cell,
        "driver": run_driver_cell,
        "timeout": run_timeout_cell,
        "exhausted": run_exhausted_cell,
        "queue": run_queue_cell,
        "listener": run_listener_cell,
    }[s.row.kind]
    started = time.monotonic()
    result = runner(s)
    s.notes.append(f"{time.monotonic() - started:.1f}s")
    return result
