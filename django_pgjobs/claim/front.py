"""Where a worker's next claim may start reading the claim index: past the entries of
the jobs it already claimed.

Each claimed job leaves its entry in the partial claim index (``status =
'pending'``) until VACUUM removes it, and the entries of the oldest jobs come first
in the index's order. A claim that reads from the start visits each such entry's
row to find it is no longer pending; while a long transaction holds the xmin
horizon nothing removes them, and a claim visited one row per job claimed since
the horizon was taken, a cost that grew with every minute of the hold (see
docs/explanation/performance.md). So the claim takes a lower bound on ``run_at``
(``Job.objects.claimable(since=...)``): an index condition, checked on the index
entry itself, so the entries before it cost no visit to their rows.

The bound must never pass over a job that is pending and due. It moves forward
only after a claim that took fewer jobs than it asked for: that claim took every
due pending job it could see in its queues, so what is left below the run_at of
the oldest job it took (less ``SLACK``) is a job whose enqueue had not committed
yet, or one another worker had locked. The first kind announces itself: a single
enqueue's NOTIFY carries its ``run_at`` and lowers the bound (``heard``); any other
NOTIFY, or a reconnected LISTEN, clears it. For everything else (a notification
lost, rows another worker's claim locked and gave back, a row written without
``pgjobs_enqueue``) a worker with LISTEN and maintenance probes every
``PROBE_EVERY`` seconds, on its maintenance thread, for a pending job before the
bound (``probe.py``) and lowers the bound to it (``probed``). The
probe walks the same dead entries a claim from the start of the index would, but no
claim waits for it: under a held xmin horizon that walk grew to a few hundred
milliseconds, and the claim that did it every 10 s delayed every job enqueued
meanwhile. A claim still reads the whole index when no probe has begun for
``UNPROBED_AFTER`` seconds (the maintenance thread failing or held up), and every
``SWEEP_EVERY`` seconds in a worker that does not probe (no maintenance; without
LISTEN, every poll).

The bound alone is not a seek: the claim index is ``(queue, priority DESC, run_at,
id)``, so within a queue the scan still steps over the dead entries of every
priority before it reaches the bound (checked on the entries, no row visit, but a
walk that grows with every job claimed under a held horizon). So the claims also
name the priorities to seek (``levels``): one scan per queue and priority, each
starting at the bound (``JOB_CLAIM_LEVELS``). The levels are every priority this
worker has seen a job of: announced by a NOTIFY (the single and bulk enqueue's
payload says its priority), taken by a claim, or found by the probe, which also
reads the priorities of the pending jobs at or past the bound (or the oldest job it
found). The set only grows, so a retried job's priority stays in it. Until the first
probe, after a NOTIFY that does not say its priority (a workflow's release,
``pgjobs_enqueue()``), and with more than ``MAX_LEVELS`` priorities seen, the claims
do not seek by level. A job of a priority never seen, written without a NOTIFY
that says it (by hand, or another worker's retry of a job this worker never saw),
is found by the next probe, as a job before the bound is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta

from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.epoch import from_epoch_us

#: Below the oldest job a claim took, how far the bound stays back: an enqueue that
#: commits this long after its statement began (its ``run_at``) is still found.
SLACK = timedelta(seconds=1)
#: A worker with LISTEN and maintenance probes for jobs before its bound this often
#: (seconds; probe.py)...
PROBE_EVERY = 10.0
#: ... and its claims read the whole index only when no probe has begun for this long.
UNPROBED_AFTER = 2 * PROBE_EVERY
#: With more priorities seen than this, a worker's claims do not seek by level (one
#: scan per queue and level would cost more than the walk it saves).
MAX_LEVELS = 8
#: A worker with LISTEN and no maintenance claims from the start of the index this
#: often (seconds); without LISTEN, every POLL_INTERVAL.
SWEEP_EVERY = 10.0


def _lower(a: datetime | None, b: datetime | None) -> datetime | None:
    """The lower bound of the two; None is no bound (below everything)."""
    if a is None or b is None:
        return None
    return min(a, b)


class ClaimFront:
    """The ``since`` bound of one worker's claims (thread-safe: the claimer asks and
    reports, the listener's thread lowers it)."""

    def __init__(self, sweep_every: float, clock: Callable[[], float] = time.monotonic):
        self.sweep_every = sweep_every
        self._clock = clock
        self._lock = threading.Lock()
        self._since: datetime | None = None
        self._swept = -float("inf")
        self._claiming = False
        self._heard_in_claim = False
        self._heard_low: datetime | None = None
        # The priorities seen (see the module's docstring); known once a probe reported.
        self._seen: set[int] = set()
        self._levels_known = False
        # A job of unknown priority was announced: the next claim does not seek by level.
        self._unsure = False
        self._unsure_in_claim = False

    def bound(self) -> datetime | None:
        """The next claim's lower bound on ``run_at`` (None: the whole index)."""
        with self._lock:
            self._claiming, self._heard_in_claim = True, False
            self._unsure_in_claim = False
            now = self._clock()
            if now - self._swept >= self.sweep_every:
                self._swept = now
                return None
            return self._since

    def levels(self) -> tuple[int, ...] | None:
        """The priorities the next claim seeks, highest first (None: every priority,
        without seeking)."""
        with self._lock:
            if not self._levels_known or self._unsure or len(self._seen) > MAX_LEVELS:
                return None
            return tuple(sorted(self._seen, reverse=True))

    def heard(self, run_at: datetime | None, priority: int | None = None) -> None:
        """A job was committed with this ``run_at`` (None: a change of unknown time)
        and ``priority`` (None: not said)."""
        with self._lock:
            self._lower_to(run_at)
            if priority is not None:
                self._seen.add(priority)
            else:
                self._unsure = True
                self._unsure_in_claim = self._unsure_in_claim or self._claiming

    def _lower_to(self, run_at: datetime | None) -> None:
        low = None if run_at is None else run_at - SLACK
        self._since = _lower(self._since, low)
        if self._claiming:  # may have committed after the claim's snapshot
            self._heard_low = low if not self._heard_in_claim else _lower(self._heard_low, low)
            self._heard_in_claim = True

    def probe_begins(self) -> tuple[datetime | None, float]:
        """A probe starts: the bound to probe below (None: nothing to probe, the next
        claim reads the whole index) and the moment, for ``probed``."""
        with self._lock:
            return self._since, self._clock()

    def probed(
        self, oldest: datetime | None, began: float, levels: Sequence[int] | None = None
    ) -> None:
        """The probe that began at ``began`` found ``oldest``, the oldest ``run_at`` of
        a pending job before the bound (None: none), and ``levels``, the priorities of
        the pending jobs from there on. Every job committed before it began is now at
        or past the bound, at a priority seen, so the claims need not sweep for them."""
        with self._lock:
            if oldest is not None:
                self._lower_to(oldest)
            if levels is not None:
                self._seen.update(levels)
                self._levels_known = True
            self._swept = max(self._swept, began)

    def claimed(
        self, run_ats: Sequence[datetime], asked: int, priorities: Sequence[int] = ()
    ) -> None:
        """The claim that asked for ``asked`` jobs took these (their ``run_at`` and
        ``priority``)."""
        self.took(min(run_ats) if run_ats else None, len(run_ats), asked, priorities)

    def took(
        self, earliest: datetime | None, count: int, asked: int, priorities: Iterable[int] = ()
    ) -> None:
        """``claimed``, told the earliest ``run_at`` of the ``count`` jobs taken (the
        worker converts one time per claim, not one per job)."""
        with self._lock:
            self._claiming = False
            self._seen.update(priorities)
            if not self._unsure_in_claim:  # this claim saw the announced job
                self._unsure = False
            if earliest is not None and 0 < count < asked:
                since: datetime | None = earliest - SLACK
                if self._heard_in_claim:
                    since = _lower(since, self._heard_low)
                self._since = since

    def took_rows(self, claimed: Sequence[Claimed], asked: int) -> None:
        """``took``, told the claimed rows: their ``run_at`` as epoch microseconds, of
        which only the smallest is converted (one time per claim, not one per job)."""
        run_ats = [c.run_at_us for c in claimed if c.run_at_us is not None]
        earliest = from_epoch_us(min(run_ats)) if run_ats else None
        self.took(earliest, len(run_ats), asked, [c.priority for c in claimed])

    def since(self) -> datetime | None:
        """The bound now (tests, the worker's log)."""
        with self._lock:
            return self._since
