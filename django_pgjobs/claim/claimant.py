"""The one object a worker asks for its next jobs (``Claimant.take``): which claim to
run, with which arguments, and what to do with its rows.

The limits are enforced by the claim statement itself (``limited.py``), so they
hold across every worker and host. A worker caches the queue rows that limit
something (refreshed every ``POLL_INTERVAL`` and at once on a queue-change NOTIFY)
and takes the unlimited fast path (``plain.py``: no extra join or lock) unless a
queue in its scope is limited or one of its tasks has a concurrency key. The fast
path takes any task and gives back (uncounted) a job of a task this worker does
not know, then filters by task from then on (deploy skew, see ``Claimant.take``).
Its claims start at the claim front's bound (``front.py``) when it has one. A queue
whose jobs have fair keys is claimed by the fair claim (``fair.py``), round-robin
over its keys, and the plain claim takes what is left of the ask; a queue without
them never meets the fair claim. The queue configuration itself (declared queues,
pause and resume) is ``queues.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.claim.fair import FairCursors, fair_queues, job_claim_fair
from django_pgjobs.claim.fair_limited import job_claim_limited_fair
from django_pgjobs.claim.front import ClaimFront
from django_pgjobs.claim.limited import queue_limits
from django_pgjobs.claim.plain import pending_queues
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.claim.run import claim
from django_pgjobs.conf import get_settings
from django_pgjobs.db.notify import QUEUES_CHANGED, parse_payload
from django_pgjobs.db.store import job_release
from django_pgjobs.jobs import registry
from django_pgjobs.support.safetext import printable

logger = logging.getLogger("django_pgjobs")


@dataclass(frozen=True)
class QueueLimits:
    name: str
    paused: bool
    max_running: int | None
    rate: str | None


class Claimant:
    """One worker's claims: ``take`` claims up to n jobs, ``heard`` takes in what a
    NOTIFY said.

    Reads the limiting queue rows at most every ``refresh`` seconds (and after
    ``invalidate()``, on a queue-change NOTIFY). One cheap query per poll interval
    per worker; nothing on the claim itself. ``front``: where the claims may start
    reading the claim index (None: from its start, every claim).
    """

    def __init__(
        self,
        queues: Sequence[str] | None,
        tasks: Sequence[str] | None = None,
        *,
        worker: str,
        front: ClaimFront | None = None,
        refresh: float | None = None,
        known_only: bool = False,
        notified: bool = False,
        fair_rows_once: bool = False,
    ):
        self.worker = worker
        self.front = front
        self.queues = list(queues) if queues else None
        definitions = registry.all_definitions()
        names = sorted(d.name for d in definitions) if tasks is None else sorted(tasks)
        self.tasks = tuple(names)
        mine = [d for d in definitions if d.name in set(names)]
        self.keyed = any(d.concurrency_key is not None for d in mine)
        # The queues claimed fairly: the default queues of this worker's tasks with a
        # fair key, and (read with the limits) those whose rows have keys or weights.
        self._fair_declared = frozenset(d.queue for d in mine if d.fair_key is not None)
        self._fair_rows: frozenset[str] = frozenset()
        # fair_rows_once: read the queues that the rows make fair once, not with every
        # re-read of the limits (testing.run_jobs re-reads those before each claim).
        # A queue that becomes fair after is still drained, by the plain claim, which
        # takes keyed rows too.
        self._fair_rows_once = fair_rows_once
        self._fair_rows_read = False
        self.cursors = FairCursors()
        self._fair_turn = 0  # which fair queue a claim serves first (several: in turn)
        self._known = frozenset(names)
        # Set once a claim returned a job of a task this worker does not know (deploy
        # skew): from then on the fast path filters by task too (see take()).
        self.skew_seen = False
        # known_only: always claim with the known-task filter, so a job of an unknown
        # task is never touched, not even given back (testing.run_jobs).
        self.known_only = known_only
        self.refresh = get_settings().POLL_INTERVAL if refresh is None else refresh
        self._loaded_at: float | None = None
        self.limits: dict[str, QueueLimits] = {}
        # Every-queue workers: the queues with pending jobs (PENDING_QUEUES),
        # claimed from by name. None: to be read again before the next claim.
        # ``notified``: NOTIFYs reach this worker (LISTEN), so a queue that gets its
        # first job is announced (saw_queue); without them, an empty claim re-reads
        # the list, so a new queue waits no longer than the poll that finds it.
        self.notified = notified
        self.pending: list[str] | None = None
        self._pending_at = 0.0
        # The claim front's bound the list was read with (None: the whole index).
        self._pending_since: datetime | None = None
        self._seen = 0  # NOTIFYs that changed the list (another thread sets it)

    def heard(self, payload: str) -> bool:
        """A NOTIFY on the jobs channel (the listener's thread); "" after LISTEN
        (re)connected, when notifications may have been missed. True when it may
        concern this worker's claims: the worker looks again."""
        said = parse_payload(payload)
        queue = said.queue
        if queue == QUEUES_CHANGED:
            self.invalidate()  # a queue was paused, resumed or edited
        else:
            self.saw_queue(queue)  # a job in a queue the claims may not cover yet
        ours = not queue or self.queues is None or queue in self.queues
        if ours and self.front is not None:
            # Jobs committed since the last claim may lie before its bound: how far
            # back and at which priority, when the payload says (an enqueue's does),
            # else anywhere and at any.
            self.front.heard(said.due, said.priority)
        return ours

    def invalidate(self) -> None:
        self._loaded_at = None
        self.pending = None

    def saw_queue(self, name: str) -> None:
        """A NOTIFY named queue ``name`` (or no queue, ``""``). It is sent with a job
        of that queue, so a list without the queue gets it, with no read: the first
        job after the list was read empty cost a read of the claim index's entries
        before the bound, which a held xmin horizon makes long. Without a name
        (LISTEN reconnected), the list is read again before the next claim."""
        pending = self.pending
        if name and pending is not None:
            if name not in pending:
                self._seen += 1  # a read under way may have missed it: it is dropped
                self.pending = sorted([*pending, name])
            return
        self._seen += 1
        self.pending = None

    def load(self, connection: BaseDatabaseWrapper) -> None:
        self.limits = {r[0]: QueueLimits(*r) for r in queue_limits(connection)}
        if not (self._fair_rows_once and self._fair_rows_read):
            self._fair_rows = frozenset(fair_queues(connection))
            self._fair_rows_read = True
        self._loaded_at = time.monotonic()

    def claim_options(
        self, connection: BaseDatabaseWrapper, since: datetime | None = None
    ) -> dict[str, Any]:
        """Keyword arguments for ``run.claim``: ``queues``, ``tasks``, ``limited``;
        ``since``: the claim front's bound, for the list of queues with pending jobs."""
        if self._loaded_at is None or time.monotonic() - self._loaded_at >= self.refresh:
            self.load(connection)
        queues = self.queues
        if queues is None:
            limited = self.keyed or bool(self.limits)
            if not limited and not self.known_only:
                queues = self._pending_queues(connection, since)
        else:
            in_scope = [self.limits[q] for q in queues if q in self.limits]
            limited = self.keyed or any(q.max_running or q.rate for q in in_scope)
            if not limited:
                # Pause alone needs no lock: leave the paused queues out of the list.
                paused = {q.name for q in in_scope if q.paused}
                queues = [q for q in queues if q not in paused]
        return {"queues": queues, "tasks": self._task_filter(limited), "limited": limited}

    def _task_filter(self, limited: bool) -> tuple[str, ...] | None:
        """The tasks a claim is restricted to (None: any task): a limited claim's, and
        every claim's once a job of an unknown task was seen or when told so."""
        return self.tasks if limited or self.skew_seen or self.known_only else None

    def probe_scope(self) -> tuple[list[str] | None, tuple[str, ...] | None]:
        """What the claims cover, for the claim front's probe: the worker's queues
        (None: every queue) and, when its claims filter by task, its tasks."""
        return self.queues, self._task_filter(self.keyed)

    def _fair_scope(self, scope: list[str] | None) -> list[str]:
        """The fair queues among ``scope`` (None: every queue, those the rows say and
        those of this worker's fair tasks: the rows are read only every ``refresh``, and
        a declared fair queue whose first jobs came since would be claimed FIFO till then)."""
        if scope is None:
            return sorted(self._fair_rows | self._fair_declared)
        return [q for q in scope if q in self._fair_declared or q in self._fair_rows]

    def _in_turn(self, fair: list[str]) -> list[str]:
        """``fair``, starting from the next one each claim (several fair queues take
        turns at being served first)."""
        self._fair_turn = (self._fair_turn + 1) % len(fair)
        return fair[self._fair_turn :] + fair[: self._fair_turn]

    def _take_fair(
        self,
        connection: BaseDatabaseWrapper,
        n: int,
        fair: list[str],
        tasks: tuple[str, ...] | None,
    ) -> list[Claimed]:
        """The fair claims of the fair queues ``fair`` (one statement per queue, the
        first queue served in turn), up to ``n`` jobs in all."""
        claimed: list[Claimed] = []
        for queue in self._in_turn(fair):
            if len(claimed) >= n:
                break
            rows, cursor = job_claim_fair(
                connection,
                worker=self.worker,
                queue=queue,
                n=n - len(claimed),
                cursor=self.cursors.get(queue),
                tasks=tasks,
            )
            self.cursors.set(queue, cursor)
            claimed += rows
        return claimed

    def _pending_queues(self, connection: BaseDatabaseWrapper, since: datetime | None) -> list[str]:
        now = time.monotonic()
        pending = self.pending
        # Read with a later bound than this claim's: it may miss a queue.
        earlier = self._pending_since is not None and (since is None or since < self._pending_since)
        if pending is None or earlier or now - self._pending_at >= self.refresh:
            seen = self._seen
            pending = pending_queues(connection, since)
            self._pending_since = since
            # A NOTIFY while the list was read may name a queue it missed: keep the
            # list for this claim only.
            self.pending = pending if seen == self._seen else None
            self._pending_at = now
        return pending

    def take(self, connection: BaseDatabaseWrapper, n: int) -> list[Claimed]:
        """Claim up to ``n`` jobs of known tasks, from the front's bound on ``run_at``
        when there is one (not in a limited claim: it ranks every pending job of its
        queues).

        The fast path has no task filter: in steady state every pending job is of a
        known task, and the filter measurably slowed the hottest statement. The first
        job of an unknown task it meets is given back at once, uncounted
        (``job_release``), and from then on this worker claims with the known-task
        filter, so it never takes such a job again.
        """
        front = self.front
        # The bound first: the list of queues with pending jobs is read with it.
        since = front.bound() if front is not None else None
        options = self.claim_options(connection, since)
        # A limited claim ranks every pending job of its queues: no bound.
        bounded = front if not options["limited"] else None
        fair = self._fair_scope(options["queues"])
        claimed: list[Claimed] = []
        if options["limited"] and fair:
            # The fair queues' limited claims, then the limited claim of the rest, in
            # one transaction behind the flow lock: nothing is left to claim after.
            claimed, cursors = job_claim_limited_fair(
                connection,
                worker=self.worker,
                queues=options["queues"],
                n=n,
                tasks=options["tasks"],
                fair=[(q, self.cursors.get(q)) for q in self._in_turn(fair)],
            )
            for queue, cursor in cursors.items():
                self.cursors.set(queue, cursor)
        elif fair:
            claimed = self._take_fair(connection, n, fair, options["tasks"])
        n_plain = 0 if options["limited"] and fair else n - len(claimed)
        # No plain claim when every queue of this worker is paused or none has pending
        # jobs, or when the fair claims filled the ask.
        if options["queues"] != [] and n_plain > 0:
            plain = claim(
                connection,
                worker=self.worker,
                n=n_plain,
                since=since if bounded is not None else None,
                levels=bounded.levels() if bounded is not None else None,
                **options,
            )
            if bounded is not None:
                # Every row the claim took, before unknown tasks are given back below.
                bounded.took_rows(plain, n_plain)
            claimed += plain
        if not claimed and self.queues is None and not self.notified:
            self.pending = None  # no NOTIFY announces a new queue: read the list again
        if claimed and options["tasks"] is None:
            unknown = [c for c in claimed if c.task not in self._known]
            if unknown:
                self.skew_seen = True
                for c in unknown:
                    job_release(connection, id=c.id, lease=c.lease)
                logger.warning(
                    "worker %s gave back %d job(s) of task(s) it does not know (%s), uncounted; "
                    "they wait for a worker that registers them (a rolling deploy?) and this "
                    "worker now claims only its own tasks. %s",
                    self.worker,
                    len(unknown),
                    ", ".join(sorted({printable(c.task) for c in unknown})),
                    registry.DISCOVERY_HINT,
                )
                claimed = [c for c in claimed if c.task in self._known]
        return claimed
