"""The claim front's priority levels (``claim/front.py``) as bookkeeping: which levels
are known, when the seek by priority is on or off (the claims that seek:
tests/db/test_claim_levels.py)."""

from __future__ import annotations

from datetime import datetime

from django_pgjobs.claim.front import MAX_LEVELS, SLACK, ClaimFront
from django_pgjobs.worker import Worker
from tests.helpers.claim_front import at


def _probed(front: ClaimFront, levels: tuple[int, ...], oldest: datetime | None = None) -> None:
    _, began = front.probe_begins()
    front.probed(oldest, began, levels)


def test_the_levels_are_known_once_a_probe_reported_and_only_grow() -> None:
    front = ClaimFront(sweep_every=1e9)
    front.heard(at(1), priority=5)  # before any probe: remembered, not yet enough
    assert front.levels() is None
    _probed(front, (0,))
    assert front.levels() == (5, 0)
    front.bound()
    front.claimed([at(2)], asked=4, priorities=[-3])
    assert front.levels() == (5, 0, -3)
    _probed(front, ())  # nothing pending now: a retry at a level seen still finds its seek
    assert front.levels() == (5, 0, -3)


def test_a_job_of_unknown_priority_turns_the_seek_off_until_a_claim_began_after_it() -> None:
    front = ClaimFront(sweep_every=1e9)
    _probed(front, (0,))
    front.heard(at(1))  # a payload without a priority (a workflow's release, say)
    assert front.levels() is None
    front.bound()
    front.claimed([at(1)], asked=4, priorities=[2])  # it saw the job: seek again
    assert front.levels() == (2, 0)
    front.bound()  # a claim starts...
    front.heard(None)  # ...and something of unknown time and priority commits meanwhile
    front.claimed([], asked=4)
    assert front.levels() is None  # the claim may not have seen it
    front.bound()
    front.claimed([], asked=4)
    assert front.levels() == (2, 0)


def test_a_probe_lowers_the_bound_without_turning_the_seek_off() -> None:
    front = ClaimFront(sweep_every=1e9)
    front.bound()
    front.claimed([at(100)], asked=2, priorities=[0])
    _probed(front, (0, 7), oldest=at(40))
    assert front.since() == at(40) - SLACK
    assert front.levels() == (7, 0)


def test_with_more_levels_than_max_the_claims_do_not_seek() -> None:
    front = ClaimFront(sweep_every=1e9)
    _probed(front, tuple(range(MAX_LEVELS)))
    assert front.levels() == tuple(reversed(range(MAX_LEVELS)))
    front.heard(at(1), priority=100)
    assert front.levels() is None


def test_the_workers_notifications_say_the_priority_to_its_front() -> None:
    """The listener's payloads reach the front: a priority said is sought at once, a
    payload without one turns the seek off until a claim began after it."""
    worker = Worker(queues=["front"], concurrency=2)
    front = worker.claimant.front
    assert front is not None
    _probed(front, (0,))
    worker.claimer.on_notify("front,1796300000000000,40")
    assert front.levels() == (40, 0)
    worker.claimer.on_notify("elsewhere,1796300000000000,70")  # not this worker's queue
    assert front.levels() == (40, 0)
    worker.claimer.on_notify("front")  # a workflow's release: no time, no priority
    assert front.levels() is None
    assert front.bound() is None  # the next claim reads from the start of the index...
    front.claimed([], asked=2)
    assert front.levels() == (40, 0)  # ...and then the claims seek again
