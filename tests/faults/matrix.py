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

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import ROOT, WorkerProcess, wait_until
from tests.faults.conftest import Workers, django_env
from tests.faults.matrix_rows import (
    ATOMIC,
    CHUNK,
    CRASHER,
    DURABLE,
    FINAL,
    FRESH_DEADLINE,
    HELD_KEY,
    KEYED,
    SETTLE_DEADLINE,
    STEP,
    UNKNOWN,
    WAITS,
    Row,
)


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
    callbacks: list[int] = field(default_factory=list)  # workflow callbacks (atomic jobs)
    #: jobs whose job_fenced is expected (cancelled while running)
    fence_expected: set[int] = field(default_factory=set)
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

    def workflow_setup(self) -> None:
        """A chord: two STEP members (the first held 1.5 s, so the repair pass meets
        its callback blocked; for the repair pass's own rows held until the statement
        fired, at most 30 s: on a loaded box the worker's first pass can come later than
        1.5 s) and an ATOMIC callback (its effect row commits with its completion: one
        row means it ran once), written as ``Workflow.enqueue`` does."""
        run = self.db.execute(
            "INSERT INTO django_pgjobs_workflow (name, kind, created_at)"
            " VALUES ('fault chord', 'chord', now()) RETURNING id"
        ).fetchone()[0]
        hold: dict[str, Any] = {"hold": 1.5}
        repair = self.row.statement.startswith("db.WF_REPAIR")
        if repair:
            hold = {"hold": 30.0, "until_file": str(self.fired_path)}
        # a result larger than a page (read alone, in pieces) for the pieces' own row
        large = {"pad": 300_000} if self.row.statement == "db.PARENT_RESULT_PIECES" else {}
        members = [
            self.insert(STEP, priority=55, kwargs=hold),
            self.insert(STEP, priority=55, kwargs=large),
        ]
        callback = self.insert(ATOMIC, priority=55)
        self.db.execute(
            "UPDATE django_pgjobs_job SET workflow_id = %s, waiting = 0 WHERE id = ANY(%s)",
            [run, members],
        )
        self.db.execute(
            "UPDATE django_pgjobs_job SET workflow_id = %s, status = 'blocked', waiting = 2,"
            " failed_parents = 0 WHERE id = %s",
            [run, callback],
        )
        if repair:  # the pass looks at jobs blocked a minute or more (REPAIR_MIN_AGE)
            self.db.execute(
                "UPDATE django_pgjobs_job SET created_at = now() - interval '2 minutes'"
                " WHERE id = %s",
                [callback],
            )
        self.db.execute(
            "INSERT INTO django_pgjobs_jobdependency (child_id, position, parent_id)"
            " VALUES (%s, 0, %s), (%s, 1, %s)",
            [callback, members[0], callback, members[1]],
        )
        self.callbacks.append(callback)

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
        if setup in ("max_running", "rate", "fair_limited"):
            column, value = ("rate", "100/s") if setup == "rate" else ("max_running", 3)
            self.db.execute(
                f"INSERT INTO django_pgjobs_queue (name, {column}, updated_at)"
                " VALUES ('default', %s, now())",
                [value],
            )
        if setup == "workflow":
            self.workflow_setup()
        if setup == "durable":
            self.insert(DURABLE, priority=55)
        if setup == "chunk":
            # First in line: one claimed by the worker's claim, two by its chunk's fill.
            for _ in range(3):
                self.insert(CHUNK, priority=70)
        if setup == "waits":
            job = self.insert(WAITS, priority=55)
            self.db.execute(
                "INSERT INTO django_pgjobs_jobsignal (job_id, name, payload)"
                " VALUES (%s, 'go', '1')",
                [job],
            )
        if setup == "unanalysed":
            # The statistics pass analyses a table never analysed since its TRUNCATE;
            # autovacuum counts changes across TRUNCATEs (mod_since_analyze) and, once
            # the cells before passed its threshold, could analyse this one first: the
            # pass would then have nothing to do (seen twice on CI). The db fixture
            # turns autovacuum back on for the next cell.
            self.db.execute("ALTER TABLE django_pgjobs_job SET (autovacuum_enabled = off)")
        if setup == "keyed_ghost":
            # The ghost's running job (standard_workload) has a key: the reaper holds
            # its slot; a job of the key waits until the ghost counts as gone.
            self.db.execute(
                "UPDATE django_pgjobs_job SET concurrency_key = %s, concurrency_limit = 1"
                " WHERE worker = 'ghost' AND status = 'running'",
                [HELD_KEY],
            )
            self.keyed(self.insert(STEP, priority=5))
        if setup == "suspect_crash":
            # First in line: os._exit(9) in its own child process, twice (max_attempts 2).
            crasher = self.insert(
                CRASHER, priority=70, kwargs={"seconds": 0}, max_attempts=2, allowed=("dead",)
            )
            self.db.execute("UPDATE django_pgjobs_job SET suspect = true WHERE id = %s", [crasher])
        if setup in ("fair", "fair_limited"):
            # Two fair keys over the workload's pending jobs: the worker's claims of
            # their queue rotate between the keys.
            self.db.execute(
                "UPDATE django_pgjobs_job SET fair_key = 'tenant:' || mod(id, 2)"
                " WHERE status = 'pending'"
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

    def keyed(self, job_id: int) -> int:
        """Give ``job_id`` the held-slot cells' concurrency key (limit 1)."""
        self.db.execute(
            "UPDATE django_pgjobs_job SET concurrency_key = %s, concurrency_limit = 1"
            " WHERE id = %s",
            [HELD_KEY, job_id],
        )
        return job_id

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
            # A driver is a Django start-up and a few statements, some retried; on a
            # loaded two-core box that can take a minute.
            timeout=120,
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

    def started(self, job_id: int) -> bool:
        row = self.db.execute(
            "SELECT count(*) FROM fault_effects WHERE job_id = %s AND phase = 'start'", [job_id]
        ).fetchone()
        return bool(row and row[0])

    def slots_back(self) -> str:
        """The "slots_back" invariant, read while the workers still run: every held
        slot is given back within SETTLE_DEADLINE (runs end, gone workers are forgotten)."""
        query = "SELECT job_id, lease, worker FROM django_pgjobs_heldslot"
        try:
            wait_until(
                lambda: not self.db.execute(query).fetchall(),
                timeout=SETTLE_DEADLINE,
                interval=0.1,
                message="held slots given back",
            )
            return "ok"
        except AssertionError:
            return f"held slots left: {self.db.execute(query).fetchall()}"

    def limit_held(self) -> str:
        """The "limit" invariant: the runs of HELD_KEY (start/end effects per run, a run
        without an end lasting for ever) never overlap."""
        runs = self.db.execute(
            "SELECT e.job_id, e.lease, min(e.at) FILTER (WHERE e.phase = 'start'),"
            " max(e.at) FILTER (WHERE e.phase = 'end')"
            " FROM fault_effects e JOIN django_pgjobs_job j ON j.id = e.job_id"
            " WHERE j.concurrency_key = %s GROUP BY e.job_id, e.lease",
            [HELD_KEY],
        ).fetchall()
        spans = sorted((r[2], r[3], r[0], r[1]) for r in runs if r[2] is not None)
        overlaps = [
            f"{a[2]}/{a[3]} and {b[2]}/{b[3]}"
            for i, a in enumerate(spans)
            for b in spans[i + 1 :]
            if a[1] is None or b[0] < a[1]
        ]
        return "ok" if not overlaps else "runs at once under limit 1: " + ", ".join(overlaps)

    def fired(self) -> list[dict[str, Any]]:
        if not self.fired_path.exists():
            return []
        return [json.loads(x) for x in self.fired_path.read_text().splitlines() if x]

    def _released(self) -> str:
        """No blocked job whose parents have all finished; no completed child started
        before a completed parent's (last) completion; every workflow callback
        completed with exactly one effect row (atomic: one row = one completed run)."""
        problems = [
            f"{job_id} still blocked"
            for (job_id,) in self.db.execute(
                "SELECT c.id FROM django_pgjobs_job c WHERE c.status = 'blocked' AND NOT EXISTS"
                " (SELECT 1 FROM django_pgjobs_jobdependency e JOIN django_pgjobs_job p"
                "  ON p.id = e.parent_id WHERE e.child_id = c.id"
                "  AND p.status NOT IN ('completed', 'dead', 'cancelled'))"
            ).fetchall()
        ]
        problems += [
            f"{child} started before its parent {parent} completed"
            for child, parent in self.db.execute(
                "SELECT c.id, p.id FROM django_pgjobs_job c"
                " JOIN django_pgjobs_jobdependency e ON e.child_id = c.id"
                " JOIN django_pgjobs_job p ON p.id = e.parent_id"
                " WHERE c.status = 'completed' AND p.status = 'completed'"
                " AND c.started_at < p.finished_at"
            ).fetchall()
        ]
        for callback in self.callbacks:
            effects = self.db.execute(
                "SELECT count(*) FROM fault_effects WHERE job_id = %s", [callback]
            ).fetchone()[0]
            if self.status(callback) != "completed" or effects != 1:
                problems.append(f"callback {callback}: {self.status(callback)}, {effects} runs")
        return "ok" if not problems else "; ".join(problems)

    def signals(self) -> list[dict[str, Any]]:
        if not self.signals_path.exists():
            return []
        return [json.loads(x) for x in self.signals_path.read_text().splitlines() if x]

    # -- invariants ------------------------------------------------------------------

    def check(self, *, not_wedged: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Each invariant: "ok" or what broke it (``extra``: the row kind's own, the
        others of INVARIANTS are "ok" where they do not apply)."""
        out: dict[str, str] = {
            "all_or_nothing": "ok",
            "honoured": "ok",
            "listener": "ok",
            "slots_back": "ok",
            "kept_alive": "ok",
            "delivered": "ok",
        }
        out.update(extra or {})
        out["limit"] = self.limit_held()
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
        out["released"] = self._released()
        fenced = [
            f"{s['job_id']} ({s.get('write')})"
            for s in signals
            if s["signal"] == "job_fenced" and s["job_id"] not in self.fence_expected
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
