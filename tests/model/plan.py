"""The ops of the model and the plan of steps a seed makes.

A plan is drawn from the seed alone, before anything runs, so a seed replays the
same steps (``PGJOBS_MODEL_SEED``); which job a cancel or a retry hits is drawn at
run time from the jobs then in that state, with a generator of the same seed, and
written in the step log.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

from tests.model import jobs

#: Combinations main does not handle yet. Their ops stay out of the
#: mix; each has an xfail(strict) test (tests/process/test_model.py). When a fix lands,
#: delete its entry: the op joins the mix and its xfail test turns into a failure
#: (strict), to be deleted too.
KNOWN_BROKEN: dict[str, str] = {}
#: Known-broken ops whose short scenario shows the fault only now and then (a race):
#: their xfail is not strict, and says so.
RACES: dict[str, str] = {}

#: The kinds of job an ``enqueue`` op may add, and their weights in the mix.
KINDS = {
    "plain": 3,
    "keyed": 4,
    "capped": 3,
    "unique": 2,
    "aplain": 2,
    "acapped": 1,
    "ablock": 1,
    "crash": 1,
    "gil": 1,
    "loop": 1,
}
#: The known-broken op each kind belongs to.
BROKEN_KIND = {"crash": "crash", "gil": "gil", "loop": "loop"}
#: The ops other than enqueue, and their weights.
OPS = {
    "enqueue": 10,
    "cancel": 3,
    "retry": 1,
    "pause": 1,
    "resume": 1,
    "kill": 1,
    "freeze": 1,
    "wait": 2,
    "batch": 1,  # open a batch (the next enqueues join it), or close the open one
    "prune": 1,  # a pruner pass past every retention for unfired batches' members
}
#: The hostile async kind: one per scenario, drawn apart (``_with_hostile``) so the
#: mix's draws, and what the CI seeds do, stay as they were.
HOSTILE = "cancelall"
QUEUES = (jobs.PLAIN, jobs.KEYED, jobs.CAPPED, jobs.ASYNC)
#: Loss events (SIGKILL, freeze) per scenario: fewer than a job's attempts, so no
#: innocent job can be dead-lettered by them alone.
MAX_LOSSES = 3
KEYS = ("a", "b", "c")


@dataclass(frozen=True)
class Op:
    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.name}({inner})"


@dataclass(frozen=True)
class Profile:
    name: str
    steps: int
    workers: int
    concurrency: int
    #: scenarios to run at most, and the wall-clock budget for starting a new one
    scenarios: int
    minutes: float
    seeds: tuple[int, ...] = ()


#: The CI seeds: between them every op and kind of the mix, a timeout hit by a keyed,
#: a capped and an async job (row B), a SIGKILL and a freeze each (test_ci_seeds...).
SHORT = Profile(
    "short", steps=16, workers=2, concurrency=3, scenarios=2, minutes=2.0, seeds=(940, 2947)
)
LONG = Profile("long", steps=28, workers=3, concurrency=3, scenarios=10_000, minutes=12.0)


def profile() -> Profile:
    """PGJOBS_MODEL_PROFILE=long (PGJOBS_MODEL_MINUTES, default 12) or the short one."""
    if os.environ.get("PGJOBS_MODEL_PROFILE", "short") == "long":
        minutes = float(os.environ.get("PGJOBS_MODEL_MINUTES", LONG.minutes))
        return Profile("long", LONG.steps, LONG.workers, LONG.concurrency, LONG.scenarios, minutes)
    return SHORT


def features(plan: list[Op]) -> set[str]:
    """What a plan exercises: its ops, its kinds, ``<kind>-timeout`` for a timeout hit."""
    found = set()
    for op in plan:
        if op.name != "enqueue":
            found.add(op.name)
            continue
        kind, timeout = op.args["kind"], op.args.get("timeout")
        found.add(kind)
        if timeout is not None and timeout < op.args.get("seconds", 0):
            found.add(f"{kind}-timeout")
    return found


def _enqueue(rng: random.Random, kind: str) -> Op:
    args: dict[str, Any] = {"kind": kind, "count": rng.choice((1, 2, 3, 4))}
    if kind == "crash":
        # Charged for each crash once it runs alone: two attempts bound its retries.
        args.update(count=1, attempts=2)
        return Op("enqueue", args)
    if kind == "loop":
        args["count"] = 1
        return Op("enqueue", args)
    if kind == "gil":
        args.update(count=1, seconds=6.0)
        return Op("enqueue", args)
    seconds = rng.choice((0.1, 0.3, 0.8, 1.5, 2.5))
    args["seconds"] = seconds
    if kind in ("keyed", "unique"):
        args["key"] = rng.choice(KEYS)
    if kind == "ablock":
        # Blocks its loop: short and one at a time, so that the async neighbours'
        # timeouts (seconds + 30 when not meant to hit) are not reached by waiting.
        args.update(count=1, seconds=rng.choice((0.3, 0.8)))
        return Op("enqueue", args)
    if kind in ("plain", "keyed", "capped", "aplain", "acapped") and rng.random() < 0.3:
        # Hit (a run of 2.5 s, a timeout of 1 s) or not (the timeout far above the run,
        # beyond what GIL-holding neighbours could add: 6 s each, up to twice that on a
        # loaded box, and two may share a worker; with + 8 s, CI's seed 1294 timed a
        # keyed job out behind one and the model counted its retry as a second run).
        if rng.random() < 0.6:
            args.update(timeout=1.0, seconds=2.5)
        else:
            args["timeout"] = seconds + 30.0
    return Op("enqueue", args)


def _with_hostile(seed: int, plan: list[Op]) -> list[Op]:
    """One job that cancels every task of its loop, right after an async enqueue (its
    neighbours are likely still running or claimed with it), from a generator of its
    own."""
    rng = random.Random(f"{HOSTILE}:{seed}")
    asynchronous = [
        i
        for i, op in enumerate(plan)
        if op.name == "enqueue" and op.args["kind"] in ("aplain", "acapped", "ablock")
    ]
    at = rng.choice(asynchronous) + 1 if asynchronous else rng.randrange(len(plan) + 1)
    hostile = Op("enqueue", {"kind": HOSTILE, "count": 1, "attempts": 1})
    return [*plan[:at], hostile, *plan[at:]]


#: The chunk handler's kind: one enqueue of it per scenario, drawn apart like the
#: hostile one (``_with_chunk``).
CHUNK = "chunk"


def _with_chunk(seed: int, plan: list[Op]) -> list[Op]:
    """Jobs of a chunk handler, enqueued together at a place of their own generator's
    choosing, half the time with a timeout the call runs past."""
    rng = random.Random(f"{CHUNK}:{seed}")
    args: dict[str, Any] = {"kind": CHUNK, "count": rng.choice((3, 4, 5))}
    args["seconds"] = rng.choice((0.3, 0.8, 1.5))
    if rng.random() < 0.5:
        args.update(timeout=1.0, seconds=2.5)
    at = rng.randrange(len(plan) + 1)
    return [*plan[:at], Op("enqueue", args), *plan[at:]]


#: The debounced kinds (keep="latest", keep="first"): bursts of enqueues of one key
#: each per scenario, drawn apart like the chunk handler's (``_with_debounce``).
DEBOUNCE, DEBOUNCE_FIRST = "debounce", "debouncefirst"


def _with_debounce(seed: int, plan: list[Op]) -> list[Op]:
    """For each debounced kind, a burst of enqueues of one key at a place of its own
    generator's choosing: they join one pending job, which runs with the last (or the
    first) arguments it was given; most of the time a second burst after a pause finds
    the first one's job pending, running (a run of 1 s: it makes a new job) or done."""
    rng = random.Random(f"{DEBOUNCE}:{seed}")
    for kind, key in ((DEBOUNCE, "d"), (DEBOUNCE_FIRST, "f")):
        burst = {"kind": kind, "count": rng.choice((3, 5, 8)), "key": key}
        burst["seconds"] = rng.choice((0.2, 1.0))
        ops = [Op("enqueue", burst)]
        if rng.random() < 0.7:
            ops += [Op("wait", {"seconds": rng.choice((0.2, 0.5))}), Op("enqueue", dict(burst))]
        at = rng.randrange(len(plan) + 1)
        plan = [*plan[:at], *ops, *plan[at:]]
    return plan


#: The fair kinds: ``fair`` on the capped queue (max_running), ``fairkeyed`` on the
#: keyed queue (concurrency keys shared with the keyed kind), drawn apart
#: (``_with_fair``). HEAVY's backlog is enqueued first, then one job of each of
#: LIGHT's tenants, in one transaction (enqueued one by one, the first jobs of the
#: backlog were claimed before the last tenant's job was in): a fair claim starts
#: them before that backlog is through (checks.fairness).
FAIR, FAIR_KEYED = "fair", "fairkeyed"
HEAVY, LIGHT = "h", ("m", "n")


def _with_fair(seed: int, plan: list[Op]) -> list[Op]:
    """The fair burst at one place, and two enqueues of fairkeyed jobs (a timeout hit
    now and then) at others, from a generator of their own."""
    rng = random.Random(f"{FAIR}:{seed}")
    light = [{"kind": FAIR, "count": 1, "seconds": 0.2, "tenant": t} for t in LIGHT]
    ops = [
        Op(
            "enqueue",
            {
                "kind": FAIR,
                "count": 8,
                "seconds": 0.2,
                "tenant": HEAVY,
                "then": light,
                "together": True,
            },
        )
    ]
    for _ in range(2):
        args: dict[str, Any] = {"kind": FAIR_KEYED, "count": rng.choice((1, 2, 3))}
        args.update(
            key=rng.choice(KEYS), tenant=rng.choice(LIGHT), seconds=rng.choice((0.1, 0.3, 0.8))
        )
        if rng.random() < 0.3:
            # one job: a timed-out run holds its key's slot until its thread ends
            args.update(count=1, timeout=1.0, seconds=2.5)
        ops.append(Op("enqueue", args))
    for op in ops:
        at = rng.randrange(len(plan) + 1)
        plan = [*plan[:at], op, *plan[at:]]
    return plan


def make_plan(seed: int, steps: int, *, broken: frozenset[str] = frozenset()) -> list[Op]:
    """The steps of a scenario. ``broken``: the known-broken ops to mix in anyway
    (the xfail tests); the others stay out while they are in KNOWN_BROKEN."""
    rng = random.Random(seed)
    allowed_kinds = {
        k: w
        for k, w in KINDS.items()
        if k not in BROKEN_KIND or BROKEN_KIND[k] in broken or BROKEN_KIND[k] not in KNOWN_BROKEN
    }
    plan: list[Op] = []
    losses = 0
    while len(plan) < steps:
        name = rng.choices(list(OPS), weights=list(OPS.values()))[0]
        if name == "enqueue":
            kind = rng.choices(list(allowed_kinds), weights=list(allowed_kinds.values()))[0]
            plan.append(_enqueue(rng, kind))
        elif name in ("kill", "freeze"):
            if losses >= MAX_LOSSES:
                continue
            losses += 1
            args: dict[str, Any] = {"worker": rng.randrange(64)}
            if name == "freeze":
                args["seconds"] = 4.5
            plan.append(Op(name, args))
        elif name in ("pause", "resume"):
            plan.append(Op(name, {"queue": rng.choice(QUEUES)}))
        elif name == "cancel":
            plan.append(
                Op(
                    "cancel",
                    {
                        "state": rng.choice(("running", "running", "pending", "any")),
                        "via": rng.choice(("command", "queryset")),
                    },
                )
            )
        elif name in ("retry", "batch", "prune"):
            plan.append(Op(name, {}))
        else:
            plan.append(Op("wait", {"seconds": rng.choice((0.2, 0.5, 1.0, 2.0))}))
    plan = _with_fair(seed, _with_debounce(seed, _with_chunk(seed, _with_hostile(seed, plan))))
    # Each known-broken op asked for comes first, beside innocent jobs claimed with it
    # (two attempts each, as in the findings, so a scenario shows it quickly).
    prelude: list[Op] = []
    if "frozen-slot" in broken:
        # A keyed run timed out (its slot held while its thread sleeps on), then its
        # worker frozen past STALE_AFTER; the key's next job waits on another worker.
        prelude += [
            Op(
                "enqueue", {"kind": "keyed", "count": 2, "seconds": 3.0, "timeout": 1.0, "key": "z"}
            ),
            Op("freeze", {"worker": 0, "seconds": 4.5, "held": True}),
            Op("wait", {"seconds": 6.0}),
        ]
    if "loop" in broken:
        # Async neighbours claimed with the loop-stopping job, in one claim: its queue
        # paused while they are enqueued, then resumed.
        after = {"kind": "aplain", "count": 3, "seconds": 1.0, "attempts": 2}
        prelude += [
            Op("pause", {"queue": "model-async"}),
            Op("enqueue", {"kind": "loop", "count": 1, "then": [after]}),
            Op("resume", {"queue": "model-async"}),
            Op("wait", {"seconds": 6.0}),
        ]
    for op in sorted(broken - {"frozen-slot", "loop"}):
        neighbour = "aplain" if op == "loop" else "plain"
        prelude.append(
            Op("enqueue", {"kind": neighbour, "count": 3, "seconds": 2.5, "attempts": 2})
        )
        first = _enqueue(rng, op)
        prelude.append(Op("enqueue", {**first.args, "attempts": 2}))
    return prelude + plan
