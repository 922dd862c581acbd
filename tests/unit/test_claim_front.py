"""The claim front's bookkeeping (``claim/front.py``), on an injected clock: the bound
moves only after a claim that took less than it asked, notifications and probes lower
it (against the claim index: tests/db/test_claim_front.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_pgjobs.claim.front import SLACK, ClaimFront
from django_pgjobs.db.notify import Payload, parse_payload
from tests.helpers.claim_front import at


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_bound_moves_only_after_a_claim_that_took_less_than_it_asked() -> None:
    front = ClaimFront(sweep_every=1e9)
    assert front.bound() is None  # the first claim reads the whole index
    front.claimed([at(5), at(3), at(9)], asked=10)  # it took every due job it saw
    assert front.since() == at(3) - SLACK
    assert front.bound() == at(3) - SLACK
    front.claimed([at(20)] * 10, asked=10)  # full: older jobs of lower priority may wait
    assert front.since() == at(3) - SLACK
    front.claimed([], asked=10)  # nothing: nothing learnt
    assert front.since() == at(3) - SLACK
    front.claimed([at(1)], asked=10)  # the bound may move back too
    assert front.since() == at(1) - SLACK


def test_a_notification_lowers_the_bound_and_one_of_unknown_time_clears_it() -> None:
    front = ClaimFront(sweep_every=1e9)
    front.bound()
    front.claimed([at(100)], asked=2)
    front.heard(at(120))  # later than the bound: no change
    assert front.since() == at(100) - SLACK
    front.heard(at(50))  # committed late: enqueued before the bound
    assert front.since() == at(50) - SLACK
    front.heard(None)  # a NOTIFY that does not say when (a resume, pgjobs_enqueue)
    assert front.since() is None


def test_a_notification_during_a_claim_is_not_lost_when_the_claim_reports() -> None:
    """The job may have committed after the claim's snapshot: the claim did not see it,
    so the bound the claim reports must stay below it."""
    front = ClaimFront(sweep_every=1e9)
    front.bound()
    front.claimed([at(100)], asked=2)
    front.bound()  # a claim starts...
    front.heard(at(150))  # ...a job due at 150 commits meanwhile...
    front.claimed([at(200)], asked=2)  # ...and the claim took only a later one
    assert front.since() == at(150) - SLACK
    front.bound()
    front.heard(None)
    front.claimed([at(300)], asked=2)
    assert front.since() is None


def test_the_whole_index_is_read_every_sweep() -> None:
    clock = Clock()
    front = ClaimFront(sweep_every=10.0, clock=clock)
    assert front.bound() is None
    front.claimed([at(0)], asked=2)
    clock.now = 9.9
    assert front.bound() == at(0) - SLACK
    clock.now = 10.0
    assert front.bound() is None
    clock.now = 15.0
    assert front.bound() == at(0) - SLACK


def test_a_probe_lowers_the_bound_to_what_it_found_and_stands_in_for_the_sweep() -> None:
    clock = Clock()
    front = ClaimFront(sweep_every=20.0, clock=clock)
    assert front.bound() is None
    front.claimed([at(100)], asked=2)
    clock.now = 15.0
    since, began = front.probe_begins()
    assert (since, began) == (at(100) - SLACK, 15.0)
    front.probed(None, began)  # nothing before the bound
    assert front.since() == at(100) - SLACK
    clock.now = 30.0  # 20 s since the first claim, 15 since the probe began
    assert front.bound() == at(100) - SLACK
    since, began = front.probe_begins()
    front.probed(at(40), began)  # a job nobody announced
    assert front.since() == at(40) - SLACK
    clock.now = 50.0  # no probe for 20 s: the claim reads the whole index again
    assert front.bound() is None


def test_a_probe_while_a_claim_runs_is_not_lost_when_the_claim_reports() -> None:
    front = ClaimFront(sweep_every=1e9)
    front.bound()
    front.claimed([at(100)], asked=2)
    front.bound()  # a claim starts...
    _, began = front.probe_begins()
    front.probed(at(60), began)  # ...the probe finds an older job meanwhile...
    front.claimed([at(200)], asked=2)  # ...and the claim, which did not see it, reports
    assert front.since() == at(60) - SLACK


def test_a_probe_without_a_bound_reads_nothing() -> None:
    front = ClaimFront(sweep_every=20.0)
    since, _ = front.probe_begins()
    assert since is None


@pytest.mark.parametrize(
    ("payload", "parsed"),
    [
        ("emails", Payload("emails")),
        ("", Payload("")),
        ("pgjobs:queues", Payload("pgjobs:queues")),
        ("emails,1796300000000000", Payload("emails", datetime.fromtimestamp(1796300000, tz=UTC))),
        ("emails,-1000000", Payload("emails", datetime.fromtimestamp(-1, tz=UTC))),
        (
            "emails,1796300000000000,-7",
            Payload("emails", datetime.fromtimestamp(1796300000, tz=UTC), -7),
        ),
        ("emails,x", Payload("emails,x")),
        ("emails,1796300000000000,x", Payload("emails,1796300000000000,x")),
        ("a,1,2,3", Payload("a,1,2,3")),
    ],
)
def test_payloads(payload: str, parsed: Payload) -> None:
    assert parse_payload(payload) == parsed
