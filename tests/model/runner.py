"""One scenario from start to end: workers up, the plan's steps with the checks after
each, then everything settles (queues resumed, workers thawed, every job final and
every run ended) and the end checks run. A failure says the seed, how to replay it,
the steps as they ran and where the workers' logs are."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django_pgjobs.models import HeldSlot, Job, JobResult, KnownTask, Queue
from django_pgjobs.models import Worker as WorkerRow
from tests.conftest import WorkerProcess
from tests.model import checks, records
from tests.model.plan import Op, make_plan
from tests.model.world import FINAL, World, owner_pid, statuses

#: How long every job may take to be final once the steps are over (a loaded box).
SETTLE = 150.0
#: Runs that never write their end: a crash takes its process along, a job that
#: stops its event loop is failed there and then (neither holds a limit slot).
UNENDING = ("crash", "aloop")
#: Between two steps: time for the workers to act on the last one.
GAP = 0.3


@dataclass(frozen=True)
class Summary:
    seed: int
    steps: int
    jobs: int
    runs: int
    seconds: float


class ModelFailure(AssertionError):
    pass


def replay_hint(seed: int, broken: frozenset[str]) -> str:
    if broken:
        return f"(a known-broken scenario: tests/process/test_model.py::test_known_broken[{min(broken)}])"
    return f"PGJOBS_MODEL_SEED={seed} scripts/dev test tests/process/test_model.py -k scenarios"


def settled(world: World) -> bool:
    ids = [*world.notes, *world.batches.callbacks()]
    now = statuses(ids)
    if len(now) < len(ids) or any(s not in FINAL for s in now.values()):
        return False
    end = world.run_ends()
    return all(end(r) < math.inf for r in records.all_runs() if r.kind not in UNENDING)


def run_scenario(
    start: Callable[..., WorkerProcess],
    seed: int,
    *,
    steps: int,
    workers: int,
    concurrency: int,
    broken: frozenset[str] = frozenset(),
    settle: float = SETTLE,
) -> Summary:
    began = time.monotonic()
    plan = make_plan(seed, steps, broken=broken)
    records.create()
    world = World(start, seed, workers, concurrency, broken)
    world.setup_queues()
    try:
        world.wait_ready()
        for op in plan:
            world.apply(op)
            world.idle(GAP)
            fail_on(checks.during(world), world, seed, plan, broken)
        world.note("settle: queues resumed, workers thawed, the open batch closed")
        world.note(world.batches.close())
        world.resume_all()
        world.thaw_all()
        late: list[str] = []
        try:
            world.wait_for(lambda: settled(world), settle, "every job final, every run ended")
        except AssertionError as exc:
            late = [f"nothing lost: {exc}", *stragglers(world)]
        fail_on(late + checks.at_end(world), world, seed, plan, broken)
        return Summary(
            seed, len(plan), len(world.notes), len(records.all_runs()), time.monotonic() - began
        )
    finally:
        world.stop()
        reset()


def stragglers(world: World) -> list[str]:
    """What kept the scenario from settling: jobs not final, runs not ended."""
    now = time.time()
    lines = [
        f"job {j.id} ({world.notes[j.id].kind}) still {j.status}, lease {j.lease},"
        f" worker {j.worker}, heartbeat {j.heartbeat_at}, run_at {j.run_at}"
        for j in Job.objects.filter(id__in=list(world.notes)).exclude(status__in=FINAL)
    ]
    end = world.run_ends()
    for r in records.all_runs():
        if end(r) == math.inf and r.kind not in UNENDING:
            owner = owner_pid(r)
            alive = any(w.pid == owner and w.proc.poll() is None for w in world.processes)
            lines.append(
                f"run of job {r.job_id} ({r.kind}, lease {r.lease}) on pid {r.pid} of worker"
                f" {owner} ({'alive' if alive else 'exited'}) started {now - r.started:.0f}s ago, not ended"
            )
    return lines


def keep_logs(world: World, seed: int) -> Path:
    """The workers' logs, copied where pytest's rotation of tmp folders leaves them."""
    folder = Path(tempfile.gettempdir()) / "pgjobs-model" / f"seed-{seed}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    for worker in world.processes:
        if worker.log_path.exists():
            shutil.copy(worker.log_path, folder / f"worker-{worker.pid}.log")
    return folder


def fail_on(
    problems: list[str], world: World, seed: int, plan: list[Op], broken: frozenset[str]
) -> None:
    if not problems:
        return
    lines = [
        f"model scenario seed {seed} failed at step {world.step} of {len(plan)}:",
        *(f"  - {p}" for p in problems),
        f"replay: {replay_hint(seed, broken)}",
        "the plan: " + "; ".join(str(op) for op in plan),
        "the steps as they ran:",
        *(f"  {line}" for line in world.log),
        f"worker logs (worker-<pid>.log): {keep_logs(world, seed)}",
    ]
    raise ModelFailure("\n".join(lines))


def reset() -> None:
    """Between two scenarios of one test: the tables as the next scenario expects them."""
    HeldSlot.objects.all().delete()
    JobResult.objects.all().delete()
    Job.objects.all().delete()
    WorkerRow.objects.all().delete()
    KnownTask.objects.all().delete()
    Queue.objects.all().delete()
