"""The invariants, read from what really happened: the runs' own records, the job
rows and their results, the workers' logs. Each check returns the problems it found
(an empty list: it holds). ``during`` runs after every step, ``at_end`` once every
job is final."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from django_pgjobs.models import Job, JobResult
from tests.model import jobs, records
from tests.model.plan import FAIR, HEAVY
from tests.model.records import Run
from tests.model.world import PID, World, owner_pid

#: How late a pause may still let a claim through ("within POLL_INTERVAL":
#: docs/howto/control-throughput.md).
PAUSE_GRACE = float(settings.PGJOBS["POLL_INTERVAL"])
#: The kinds whose own code never fails (the known-broken ones aside).
BROKEN_KINDS = ("crash", "gil", "loop")
#: The kinds whose runs are tasks on their worker's event loop (their ``Run.kind``).
ASYNC_KINDS = ("aplain", "acapped", "ablock", "aloop")


def peak(intervals: Sequence[tuple[float, float, Run]]) -> tuple[int, list[Run]]:
    """Most runs at one instant (an end before a start at a tie), and those runs. A run
    known only to have ended when it started (its process died unseen) counts for none."""
    kept = [(i, s, e) for i, (s, e, _) in enumerate(intervals) if e > s]
    events = sorted([(s, 1, i) for i, s, _ in kept] + [(e, -1, i) for i, _, e in kept])
    now: set[int] = set()
    best: tuple[int, list[Run]] = (0, [])
    for _, step, i in events:
        if step == 1:
            now.add(i)
        else:
            now.discard(i)
        if len(now) > best[0]:
            best = (len(now), [intervals[j][2] for j in sorted(now)])
    return best


def limits(world: World, runs: Sequence[Run]) -> list[str]:
    """A concurrency key of limit 1 and max_running never exceeded, in wall-clock time."""
    end = world.run_ends()
    by_key: dict[str, list[tuple[float, float, Run]]] = defaultdict(list)
    for run in runs:
        if run.key is not None:
            by_key[run.key].append((run.started, end(run), run))
    problems = []
    for key, intervals in sorted(by_key.items()):
        limit = jobs.CAP if key == "capped" else 1
        most, witnesses = peak(intervals)
        if most > limit:
            shown = [(r.job_id, r.lease, r.pid) for r in witnesses]
            problems.append(
                f"limit {limit} of {key!r} exceeded: {most} runs at once (job, lease, pid): {shown}"
            )
    return problems


def pauses(world: World, runs: Sequence[Run]) -> list[str]:
    """No claim from a paused queue once the pause has taken effect. A claim read the
    queue rows at some instant between ``claimed`` (its transaction's ``now()``; it
    may then wait for the flow lock) and the start of the run: only a claim whose
    whole window lies inside the pause is one the pause should have stopped."""
    problems = []
    for p in world.pauses:
        until = math.inf if p.until is None else p.until
        for run in runs:
            claimed = run.claimed if run.queue == p.queue else None
            if claimed is not None and p.at + PAUSE_GRACE < claimed and run.started < until:
                problems.append(
                    f"job {run.job_id} (lease {run.lease}, pid {run.pid}) claimed at"
                    f" {claimed:.3f} from queue {p.queue}, paused at {p.at:.3f}"
                    f" ({claimed - p.at:.2f}s before)"
                )
    return problems


def workers(world: World) -> list[str]:
    """No worker exits by itself (a crashing job aside, which takes its process along)."""
    crashers = any(n.kind == "crash" for n in world.notes.values())
    return [
        f"worker pid {e.pid} exited with {e.code} ({e.reason}) while serving jobs"
        for e in world.exits.values()
        if e.reason == "unexpected" and not crashers
    ]


def during(world: World) -> list[str]:
    runs = records.all_runs()
    return (
        limits(world, runs)
        + pauses(world, runs)
        + world.unique_errors
        + world.debounced.problems
        + workers(world)
    )


def at_end(world: World) -> list[str]:
    runs = records.all_runs()
    rows = {j.id: j for j in Job.objects.filter(id__in=list(world.notes))}
    results = dict(
        JobResult.objects.filter(job_id__in=list(world.notes)).values_list("job_id", "value")
    )
    problems = during(world)
    problems += [f"job {i} ({n.kind}) is gone" for i, n in world.notes.items() if i not in rows]
    problems += outcomes(world, rows, results)
    problems += reruns(world, rows, runs)
    problems += false_reaps(world, rows)
    problems += false_fences(world)
    problems += fairness(world, runs, rows)
    problems += world.batches.at_end()
    return problems


def outcomes(world: World, rows: dict[int, Job], results: dict[int, object]) -> list[str]:
    """Each job ended as its own code and the model's acts say it must."""
    problems = []
    for i, note in sorted(world.notes.items()):
        row = rows.get(i)
        if row is None:
            continue
        said = f"job {i} ({note.kind}, step {note.step}, {row.status}, {row.last_error!r})"
        if note.cancelled:
            expected = "cancelled"
        elif note.kind == "crash":
            expected = "dead"  # charged for killing its process
        elif note.kind == "loop":
            expected = None  # any final status: what it does to the loop is its business
        elif note.kind == "cancelall":
            expected = "dead"  # charged for cancelling its neighbours (or itself), once
            if "Cancelled" not in (row.last_error or ""):
                problems.append(f"{said}: not charged for its cancels")
        elif note.times_out:
            expected = "dead"
            if "JobTimeout" not in (row.last_error or ""):
                problems.append(f"{said}: past its timeout but not failed with JobTimeout")
        else:
            expected = "completed"  # innocent: never dead-lettered, never left behind
        if expected is None:
            if row.status not in ("completed", "dead", "cancelled"):
                problems.append(f"{said}: not final")
        elif row.status != expected:
            problems.append(f"{said}: expected {expected}")
        elif expected == "completed" and results.get(i) != note.tag:
            problems.append(f"{said}: result {results.get(i)!r}, expected {note.tag}")
    return problems


def reruns(world: World, rows: dict[int, Job], runs: Sequence[Run]) -> list[str]:
    """No job completed twice: a job nobody took away ran once, and no job ran again
    after its completion."""
    lost, restarted = world.lost_pids(), world.restarts()
    by_job: dict[int, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)
    problems = []
    for i, note in sorted(world.notes.items()):
        row = rows.get(i)
        mine = by_job.get(i, [])
        if row is None:
            continue
        if row.status == "completed" and row.finished_at is not None:
            after = [r for r in mine if r.claimed and r.claimed > row.finished_at.timestamp()]
            if after:
                problems.append(f"job {i} ({note.kind}) claimed again after it completed")
        # Taken away: by the model, its timeout, a lost worker, or a worker's restart
        # (which releases a run still going after SHUTDOWN_TIMEOUT).
        taken = (
            note.touched
            or note.times_out
            or any(owner_pid(r) in lost or r.worker in restarted for r in mine)
            or any(cut_short(r, runs) for r in mine)
        )
        if row.status == "completed" and not taken and len(mine) != 1:
            shown = [(r.lease, r.pid, r.finished) for r in mine]
            problems.append(
                f"job {i} ({note.kind}) ran {len(mine)} times (lease, pid, returned): {shown}"
            )
    return problems


def cut_short(run: Run, runs: Sequence[Run]) -> bool:
    """An async run that did not return while a job cancelling every task of the loop
    ran on its worker: given back uncharged, it runs again."""
    return (
        run.kind in ASYNC_KINDS
        and not run.finished
        and any(
            other.kind == "acancel"
            and other.worker == run.worker
            and other.started <= (run.ended or math.inf)
            and run.started <= (other.ended or math.inf)
            for other in runs
        )
    )


def fairness(world: World, runs: Sequence[Run], rows: dict[int, Job]) -> list[str]:
    """No tenant starved behind another's backlog: each light tenant's job of the fair
    burst, enqueued just after the heavy tenant's backlog, is first claimed before the
    last of that backlog is (a FIFO claim would start it last). Read from first claims,
    which a later SIGKILL, freeze or timeout does not move; jobs the model cancelled or
    retried are left out on both sides.

    So are jobs the reaper took back from a lost worker (a ``WorkerLost`` entry): what
    the fair claim promises is the order of its claims, one turn of the rotation
    (docs/howto/control-throughput.md, "fair shares"), and a job claimed in its turn
    by a worker then frozen, killed or held past STALE_AFTER waits for the reaper like
    any job (docs/explanation/guarantees.md). Its lost claim left no run record (the
    run never started), so its first recorded claim is the reclaim, after the jobs
    claimed meanwhile: a light job lost that way was seen "claimed after the last of
    the backlog" though it had its turn, and a heavy one would move the backlog's end."""
    first: dict[int, float] = {}
    for run in runs:
        first[run.job_id] = min(first.get(run.job_id, math.inf), run.claimed or run.started)
    burst = [
        n
        for n in world.notes.values()
        if n.kind == FAIR and not n.touched and n.id in first and not reaped(rows.get(n.id))
    ]
    heavy = [first[n.id] for n in burst if n.tenant == HEAVY]
    if not heavy:
        return []
    last = max(heavy)
    return [
        f"fair key {n.tenant!r}: job {n.id} first claimed {first[n.id] - last:.2f}s after the"
        f" last job of tenant {HEAVY!r}'s backlog, enqueued before it"
        for n in burst
        if n.tenant != HEAVY and first[n.id] >= last
    ]


def lost_worker_entries(row: Job | None) -> list[dict[str, Any]]:
    """The error entries the reaper wrote when it took the job back from a lost worker."""
    if row is None:
        return []
    return [
        entry
        for entry in row.errors or []
        if isinstance(entry, dict) and "WorkerLost" in str(entry.get("type"))
    ]


def reaped(row: Job | None) -> bool:
    """The reaper took the job back from a lost worker at least once."""
    return bool(lost_worker_entries(row))


def false_reaps(world: World, rows: dict[int, Job]) -> list[str]:
    """A worker that is alive is never taken for dead: every lost-worker entry names a
    worker the model killed, froze, or saw exit."""
    lost = world.lost_pids()
    problems = []
    for i, row in sorted(rows.items()):
        for entry in lost_worker_entries(row):
            m = PID.search(str(entry.get("worker") or ""))
            if m is None or int(m[1]) not in lost:
                problems.append(
                    f"job {i} ({world.notes[i].kind}) reaped from live worker {entry.get('worker')}"
                )
    return problems


def false_fences(world: World) -> list[str]:
    """A fenced write only for a job somebody else took: the model (cancel, retry), its
    timeout, or a reap after the model froze the worker that logged it."""
    problems = []
    for pid, job_id, lease, write in world.fences():
        note = world.notes.get(job_id)
        if note is None:
            continue
        if note.touched or note.times_out or pid in world.ever_frozen:
            continue
        problems.append(
            f"false job_fenced: pid {pid} logged its {write} write of job {job_id}"
            f" ({note.kind}, lease {lease}) as fenced, and nobody took that job from it"
        )
    return problems
