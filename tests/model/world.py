"""The world a plan runs in: real ``runjobs`` workers, tended like a supervisor
would (a worker that exits is replaced), and what the model knows of each job and
of each thing it did (cancels, retries, pauses, SIGKILLs, freezes), for the checks.
"""

from __future__ import annotations

import io
import math
import os
import random
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.management import call_command
from django.db import connection, transaction

from django_pgjobs import pause_queue, resume_queue
from django_pgjobs.models import HeldSlot, Job, Queue
from django_pgjobs.models import Worker as WorkerRow
from tests.conftest import WorkerProcess
from tests.model import jobs, records
from tests.model.batches import Batches
from tests.model.debounced import Debounced
from tests.model.plan import KNOWN_BROKEN, Op
from tests.model.records import Run

#: The model's workers: its jobs loaded, and a short STALE_AFTER so reaps happen
#: within a scenario (HEARTBEAT_INTERVAL 0.5 s: the check wants 3 x the interval).
WORKER_ENV = {
    "PGJOBS_TEST_MODEL": "1",
    "PGJOBS_TEST_STALE_AFTER": "3",
    "PGJOBS_TEST_HEARTBEAT": "0.5",
}
ACTIVE = ("pending", "running")
FINAL = ("completed", "dead", "cancelled")
FUNCTIONS: dict[str, Any] = {
    "plain": jobs.plain,
    "keyed": jobs.keyed,
    "capped": jobs.capped,
    "unique": jobs.unique,
    "aplain": jobs.aplain,
    "acapped": jobs.acapped,
    "ablock": jobs.ablock,
    "crash": jobs.crash,
    "gil": jobs.gil,
    "loop": jobs.aloop,
    "cancelall": jobs.acancel,
    "chunk": jobs.chunk,
    "debounce": jobs.debounce,
    "debouncefirst": jobs.debouncefirst,
    "fair": jobs.fair,
    "fairkeyed": jobs.fairkeyed,
}
DEBOUNCED = ("debounce", "debouncefirst")


@dataclass
class Note:
    """What the model knows of one job it enqueued."""

    id: int
    kind: str
    tag: int
    step: int
    seconds: float | None
    timeout: float | None
    key: str | None
    tenant: str | None = None  # the fair kinds' tenant (their fair key)
    cancelled: bool = False  # a cancel of the model changed it, and no retry since
    touched: list[str] = field(default_factory=list)

    @property
    def times_out(self) -> bool:
        return self.timeout is not None and self.seconds is not None and self.timeout < self.seconds


@dataclass
class Pause:
    queue: str
    at: float  # database clock, read after the pause committed
    until: float | None = None  # database clock, read before the resume


@dataclass
class Exit:
    pid: int
    at: float
    code: int | None
    reason: str


def db_now() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
        return float(cursor.fetchone()[0])


def statuses(ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.filter(id__in=ids).values_list("id", "status"))


class World:
    def __init__(
        self,
        start: Callable[..., WorkerProcess],
        seed: int,
        workers: int,
        concurrency: int,
        broken: frozenset[str] = frozenset(),
    ):
        self.broken = broken
        self.start = start
        self.rng = random.Random(seed + 1)  # run-time choices (which job a cancel hits)
        self.concurrency = concurrency
        self.processes: list[WorkerProcess] = []  # every worker started, for their logs
        self.slots: list[WorkerProcess] = [self.spawn() for _ in range(workers)]
        self.killed: dict[int, float] = {}
        self.frozen: dict[int, float] = {}  # pid -> when to thaw it
        self.ever_frozen: set[int] = set()
        self.exits: dict[int, Exit] = {}
        self.notes: dict[int, Note] = {}
        self.pauses: list[Pause] = []
        self.log: list[str] = []
        self.tags = 0
        self.step = 0
        self.unique_errors: list[str] = []
        self.batches = Batches()
        self.debounced = Debounced()

    # -- workers ---------------------------------------------------------------------

    def spawn(self) -> WorkerProcess:
        worker = self.start("--concurrency", str(self.concurrency), env=WORKER_ENV)
        self.processes.append(worker)
        return worker

    def wait_ready(self, timeout: float = 90) -> None:
        self.wait_for(
            lambda: (
                WorkerRow.objects.filter(pid__in=[w.pid for w in self.slots]).count()
                == len(self.slots)
            ),
            timeout,
            "the workers to register",
        )

    def lost_pids(self) -> set[int]:
        """Workers the model killed, froze, or saw exit: their jobs may be reaped."""
        return set(self.killed) | self.ever_frozen | set(self.exits)

    def tend(self) -> None:
        """Thaw the frozen workers that are due; replace a worker that exited."""
        now = time.monotonic()
        for pid, thaw in list(self.frozen.items()):
            if now >= thaw:
                os.kill(pid, signal.SIGCONT)
                del self.frozen[pid]
                self.note(f"  thawed pid {pid}")
        for i, worker in enumerate(self.slots):
            code = worker.proc.poll()
            if code is None or worker.pid in self.killed:
                continue
            text = worker.output()
            reason = "restart" if "stopped to be restarted" in text else "unexpected"
            # When it died, at the earliest: its last word, or the start of its last run
            # (a run's end is taken no later than its process's end: never too late).
            starts = [r.started for r in records.all_runs() if owner_pid(r) == worker.pid]
            at = max([os.path.getmtime(worker.log_path), *starts])
            self.exits[worker.pid] = Exit(worker.pid, at, code, reason)
            self.note(f"  worker pid {worker.pid} exited with {code} ({reason}); replaced")
            self.slots[i] = self.spawn()

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            self.tend()
            time.sleep(0.1)
        self.tend()

    def idle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.tend()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def note(self, line: str) -> None:
        self.log.append(line)

    # -- ops -------------------------------------------------------------------------

    def apply(self, op: Op) -> None:
        self.step += 1
        self.note(f"step {self.step}: {op}")
        getattr(self, f"op_{op.name}")(**op.args)

    def op_enqueue(
        self,
        kind: str,
        count: int,
        seconds: float | None = None,
        timeout: float | None = None,
        key: str | None = None,
        attempts: int | None = None,
        tenant: str | None = None,
        then: list[dict[str, Any]] | None = None,
        together: bool = False,
    ) -> None:
        if together:  # one transaction: the workers see all of it at once
            with transaction.atomic():
                self.op_enqueue(kind, count, seconds, timeout, key, attempts, tenant, then)
            return
        function = FUNCTIONS[kind]
        options: dict[str, Any] = {} if attempts is None else {"max_attempts": attempts}
        if timeout is not None:
            options["timeout"] = timeout
            if seconds is not None and timeout < seconds:
                options["max_attempts"] = 2  # a timeout is charged: bound the retries
        if kind == "unique":
            options["unique_key"] = f"model-unique:{key}"
        for _ in range(count):
            self.tags += 1
            args: list[Any] = [self.tags]
            if kind not in ("crash", "loop", "cancelall"):
                args.append(seconds)
            kwargs: dict[str, Any] = {"key": key} if kind in ("keyed", *DEBOUNCED) else {}
            if kind in ("fair", "fairkeyed"):
                kwargs = {"tenant": tenant, **({"key": key} if kind == "fairkeyed" else {})}
            holder = self.unique_holder(key) if kind == "unique" else None
            before = self.debounced.before(kind, str(key)) if kind in DEBOUNCED else None
            made = (function.using(**options) if options else function).enqueue(*args, **kwargs)
            if kind == "unique":
                self.check_unique(key, holder, made.id)
            self.batches.join(made)
            if kind in DEBOUNCED:
                retried = (
                    any("retry" in t for t in self.notes[before[0]].touched) if before else False
                )
                said = self.debounced.after(kind, str(key), before, made.id, retried)
                self.note(f"  -> job {made.id} ({said})")
                if made.id in self.notes:
                    if kind == "debounce":  # keep="latest": it runs with these arguments
                        self.notes[made.id].tag, self.notes[made.id].seconds = self.tags, seconds
                    continue
            if made.id in self.notes:
                self.note(f"  -> job {made.id} (the active job of its unique key)")
                continue
            self.notes[made.id] = Note(
                made.id, kind, self.tags, self.step, seconds, timeout, key, tenant
            )
            if kind not in DEBOUNCED:
                self.note(f"  -> job {made.id}")
        for more in then or []:  # enqueued in the same breath, no gap
            self.op_enqueue(**more)

    def unique_holder(self, key: str | None) -> int | None:
        ids = [n.id for n in self.notes.values() if n.kind == "unique" and n.key == key]
        active = sorted(i for i, s in statuses(ids).items() if s in ACTIVE)
        if len(active) > 1:
            self.unique_errors.append(f"unique key {key}: jobs {active} active at once")
        return active[0] if active else None

    def check_unique(self, key: str | None, holder: int | None, got: int) -> None:
        """A job active before and after the enqueue is what the enqueue returns."""
        if holder is None or got == holder:
            return
        if statuses([holder]).get(holder) in ACTIVE:
            self.unique_errors.append(
                f"unique key {key}: enqueue made job {got} while job {holder} was active"
            )

    def pick(self, wanted: tuple[str, ...], spared: set[str] | None = None) -> int | None:
        rows = Job.objects.filter(id__in=list(self.notes), status__in=wanted)
        found = sorted(
            i
            for i, worker in rows.values_list("id", "worker")
            if not spared or not any(s in (worker or "") for s in spared)
        )
        return self.rng.choice(found) if found else None

    def op_cancel(self, state: str, via: str) -> None:
        spared = None
        if "frozen-slot" in KNOWN_BROKEN and "frozen-slot" not in self.broken:
            # A cancel writes a held slot for the frozen worker: the known-broken case.
            spared = {f":{pid}:" for pid in self.frozen}
        target = self.pick(ACTIVE if state == "any" else (state,), spared)
        if target is None:
            self.note(f"  no {state} job to cancel")
            return
        if via == "command":
            call_command("cancel_jobs", "--ids", str(target), stdout=io.StringIO())
        else:
            Job.objects.filter(id=target).cancel()
        note = self.notes[target]
        note.touched.append(f"cancel@{self.step}")
        changed = Job.objects.get(id=target).status == "cancelled"
        note.cancelled = note.cancelled or changed
        self.note(f"  cancelled job {target} ({note.kind}): {'changed' if changed else 'too late'}")

    def op_retry(self) -> None:
        target = self.pick(("cancelled",))
        if target is None:
            self.note("  no cancelled job to retry")
            return
        note = self.notes[target]
        note.touched.append(f"retry@{self.step}")
        changed = Job.objects.filter(id=target).retry()
        if changed:
            note.cancelled = False
        self.note(f"  retried job {target} ({note.kind}): {changed} changed")

    def op_batch(self) -> None:
        self.note(self.batches.toggle())

    def op_prune(self) -> None:
        # once a member has finished, if one does soon: then the pass has one to keep
        deadline = time.monotonic() + 8.0
        while self.batches.none_finished() and time.monotonic() < deadline:
            self.idle(0.2)
        self.note(self.batches.prune())

    def op_pause(self, queue: str) -> None:
        if any(p.queue == queue and p.until is None for p in self.pauses):
            self.note("  already paused")
            return
        pause_queue(queue)
        self.pauses.append(Pause(queue, db_now()))

    def op_resume(self, queue: str) -> None:
        for p in self.pauses:
            if p.queue == queue and p.until is None:
                p.until = db_now()
        resume_queue(queue)

    def resume_all(self) -> None:
        for p in self.pauses:
            if p.until is None:
                self.op_resume(p.queue)

    def victim(self, worker: int, among: list[WorkerProcess] | None = None) -> WorkerProcess | None:
        alive = [
            w
            for w in (self.slots if among is None else among)
            if w.proc.poll() is None and w.pid not in self.frozen
        ]
        return alive[worker % len(alive)] if alive else None

    def op_kill(self, worker: int) -> None:
        target = self.victim(worker)
        if target is None:
            self.note("  no worker to kill")
            return
        os.kill(target.pid, signal.SIGKILL)
        target.proc.wait(timeout=30)
        self.killed[target.pid] = time.time()
        self.slots[self.slots.index(target)] = self.spawn()
        self.note(f"  SIGKILL pid {target.pid}; replaced")

    def holders(self) -> set[int]:
        """Pids of the workers holding a limit slot of a run written off."""
        return {
            int(m[1])
            for w in HeldSlot.objects.values_list("worker", flat=True)
            if (m := PID.search(w))
        }

    def op_freeze(self, worker: int, seconds: float, held: bool = False) -> None:
        if held:  # the known-broken "frozen-slot": freeze a worker holding a slot
            self.wait_for(lambda: self.holders() - set(self.frozen), 20, "a held slot")
            target = next(w for w in self.slots if w.pid in self.holders())
        elif "frozen-slot" in KNOWN_BROKEN and "frozen-slot" not in self.broken:
            spare = [w for w in self.slots if w.pid not in self.holders()]
            target = self.victim(worker, among=spare)
        else:
            target = self.victim(worker)
        if target is None:
            self.note("  no worker to freeze")
            return
        os.kill(target.pid, signal.SIGSTOP)
        self.frozen[target.pid] = time.monotonic() + seconds
        self.ever_frozen.add(target.pid)
        self.note(f"  SIGSTOP pid {target.pid} for {seconds}s")

    def op_wait(self, seconds: float) -> None:
        self.idle(seconds)

    # -- the end of a scenario ----------------------------------------------------------

    def thaw_all(self) -> None:
        for pid in list(self.frozen):
            self.frozen[pid] = 0.0
        self.tend()

    def setup_queues(self) -> None:
        Queue.objects.update_or_create(
            name=jobs.CAPPED, defaults={"max_running": jobs.CAP, "paused": False}
        )

    def pids_gone(self) -> dict[int, float]:
        """Worker processes gone, and when (a run of theirs ended no later)."""
        gone = dict(self.killed)
        gone.update({pid: e.at for pid, e in self.exits.items()})
        return gone

    def restarts(self) -> dict[str, float]:
        """Worker ids that restarted themselves (exec: same pid, new id), and when:
        their abandoned threads ended then, just after the line was written."""
        return {
            m[2]: float(m[1])
            for worker in self.processes
            for m in RESTARTED.finditer(worker.output())
        }

    def after_runs(self) -> dict[tuple[int, int], list[float]]:
        """(job id, worker pid) -> times of the worker's lines written once a run of
        that job had ended on it: the run given up on returned, its write fenced, its
        isolated process dead."""
        found: dict[tuple[int, int], list[float]] = {}
        for worker in self.processes:
            for m in RUN_OVER.finditer(worker.output()):
                found.setdefault((int(m[2]), worker.pid), []).append(float(m[1]))
        return found

    def run_ends(self) -> Callable[[Run], float]:
        """When a run ended: its record, else its worker's end or restart, else (a
        suspect's run, in a child process of the worker: killed when the worker gives
        up on it) the worker's first line saying so; else not yet (infinity). Read
        once, for the runs of one check."""
        gone, restarts, after = self.pids_gone(), self.restarts(), self.after_runs()

        def end(run: Run) -> float:
            if run.ended is not None:
                return run.ended
            owner = owner_pid(run)
            known = gone.get(run.pid) or gone.get(owner) or restarts.get(run.worker)
            if known is None and run.pid != owner:
                later = [t for t in after.get((run.job_id, owner), []) if t >= run.started]
                known = min(later, default=None)
            return math.inf if known is None else max(known, run.started)

        return end

    def fences(self) -> list[tuple[int, int, int, str]]:
        """(pid, job id, lease, write) of every fenced write the workers logged."""
        found = []
        for worker in self.processes:
            for m in FENCED.finditer(worker.output()):
                found.append((worker.pid, int(m[1]), int(m[2]), m[3]))
        return found

    def stop(self) -> None:
        for pid in list(self.frozen):
            os.kill(pid, signal.SIGCONT)
        self.frozen.clear()
        for worker in self.slots:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait(timeout=30)


PID = re.compile(r":(\d+):")
RUN_OVER = re.compile(
    r"^(\d+\.\d+) job (\d+)\b[^\n]*?(?:returned after|lease \d+ lost|killed its process)",
    re.MULTILINE,
)


def owner_pid(run: Run) -> int:
    """The pid of the worker a run belongs to (a suspect runs in a child of it)."""
    m = PID.search(run.worker)
    return int(m[1]) if m else run.pid


RESTARTED = re.compile(r"^(\d+\.\d+) worker (\S+) stopped to be restarted", re.MULTILINE)
FENCED = re.compile(r"job (\d+) \(.*?, attempt \d+\): lease (\d+) lost; the (\w+) write")
