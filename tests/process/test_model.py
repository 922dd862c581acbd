"""The model-based test of the combinations (tests/model/): seeded
random scenarios over real ``runjobs`` processes, checked after every step and at
the end of each scenario (see tests/model/checks.py for what is checked).

- ``test_model_scenarios``: the short profile (two fixed seeds, CI) or, with
  ``PGJOBS_MODEL_PROFILE=long``, new random seeds for ``PGJOBS_MODEL_MINUTES``
  (default 12); ``PGJOBS_MODEL_SEED=<seed>`` replays one scenario. A failure prints
  its seed and its steps.
- ``test_known_broken``: one short scenario per op of ``KNOWN_BROKEN``, expected to
  fail (strict) until its fix lands; then delete the entry, and the op joins the mix.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import WorkerProcess
from tests.model import plan, records
from tests.model.runner import ModelFailure, Summary, run_scenario

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Start = Callable[..., WorkerProcess]


@pytest.fixture(autouse=True)
def runs_table(transactional_db: None) -> None:
    records.create()


def seeds(profile: plan.Profile) -> Iterator[int]:
    if os.environ.get("PGJOBS_MODEL_SEED"):
        yield int(os.environ["PGJOBS_MODEL_SEED"])
        return
    if profile.seeds:
        yield from profile.seeds
        return
    rng = random.Random()
    while True:
        yield rng.randrange(1, 10**9)


@pytest.mark.timeout(plan.profile().minutes * 60 + 900)
def test_model_scenarios(start_worker: Start) -> None:
    profile = plan.profile()
    deadline = time.monotonic() + profile.minutes * 60
    done: list[Summary] = []
    failed: list[ModelFailure] = []
    for seed in seeds(profile):
        print(f"model: scenario seed {seed} ({profile.name} profile)", flush=True)
        try:
            done.append(
                run_scenario(
                    start_worker,
                    seed,
                    steps=profile.steps,
                    workers=profile.workers,
                    concurrency=profile.concurrency,
                )
            )
        except ModelFailure as failure:
            if profile.name != "long":
                raise
            failed.append(failure)  # the long profile goes on, and reports them all
            print(f"model: seed {seed} FAILED: {str(failure).splitlines()[1]}", flush=True)
        if len(done) + len(failed) >= profile.scenarios or time.monotonic() > deadline:
            break
    print(
        f"model: {len(done)} scenarios passed, {len(failed)} failed;"
        f" passed: {sum(s.steps for s in done)} steps, {sum(s.jobs for s in done)} jobs,"
        f" {sum(s.runs for s in done)} runs, {sum(s.seconds for s in done):.0f}s;"
        f" seeds {[s.seed for s in done]}"
    )
    if failed:
        raise AssertionError("\n\n".join(str(f) for f in failed))
    assert done


def test_ci_seeds_cover_the_mix() -> None:
    # A change to the plan's draws changes what the fixed CI seeds do: pick new ones
    # (tests/model/plan.py SHORT) that still cover every op, and row B's timeouts.
    kinds = {k for k in plan.KINDS if plan.BROKEN_KIND.get(k) not in plan.KNOWN_BROKEN}
    wanted = set(plan.OPS) - {"enqueue"} | kinds
    wanted |= {"keyed-timeout", "capped-timeout", "aplain-timeout"}
    wanted |= {plan.HOSTILE, plan.CHUNK, plan.DEBOUNCE, plan.DEBOUNCE_FIRST, plan.FAIR}
    wanted.add(plan.FAIR_KEYED)
    covered = set().union(
        *(plan.features(plan.make_plan(s, plan.SHORT.steps)) for s in plan.SHORT.seeds)
    )
    assert wanted <= covered, sorted(wanted - covered)


#: Each known-broken op's scenario: the workers it needs to show the fault.
BROKEN_SETUP = {
    "loop": {"workers": 2, "concurrency": 3},  # one claims them all; the other reaps
    "frozen-slot": {"workers": 2, "concurrency": 3},  # the next run waits on the other
}


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(
            op,
            marks=pytest.mark.xfail(
                strict=op not in plan.RACES,
                reason=f"{why} ({plan.RACES[op]})" if op in plan.RACES else why,
                raises=AssertionError,
            ),
        )
        for op, why in sorted(plan.KNOWN_BROKEN.items())
    ]
    or [
        pytest.param(
            "none",
            marks=pytest.mark.skip(reason="KNOWN_BROKEN is empty: every modelled op is in the mix"),
        )
    ],
)
def test_known_broken(start_worker: Start, op: str) -> None:
    # Expected to fail: a short settle (a run that never ends is one of the failures).
    run_scenario(start_worker, 7, steps=3, broken=frozenset({op}), settle=40, **BROKEN_SETUP[op])
