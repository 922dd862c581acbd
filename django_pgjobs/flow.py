"""Flow control: queues as rows (pause, ``max_running``, ``rate``), per-key limits.

The limits are enforced by the claim statement itself (``JOB_CLAIM_LIMITED_*``),
so they hold across every worker and host. This module decides, per worker, which
claim to run: a worker caches the queue rows that limit something (refreshed every
``POLL_INTERVAL`` and at once on a queue-change NOTIFY) and takes the unlimited
fast path — the 0.1 claim, no extra join or lock — unless a queue in its scope is
limited or one of its tasks has a concurrency key. The fast path takes any task
and gives back (uncounted) a job of a task this worker does not know, then filters
by task from then on (deploy skew, see ``FlowState.claim``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs import claims, registry
from django_pgjobs.claim_front import ClaimFront
from django_pgjobs.conf import get_settings, suggest
from django_pgjobs.db.claim import Claimed, pending_queues
from django_pgjobs.db.claim_limited import queue_limits
from django_pgjobs.db.epoch import from_epoch_us
from django_pgjobs.db.job_outcome import job_release
from django_pgjobs.db.notify import JOB_NOTIFY
from django_pgjobs.db.tables import QUEUE
from django_pgjobs.safetext import printable
from django_pgjobs.states import TERMINAL
from django_pgjobs.validation import check_queue

logger = logging.getLogger("django_pgjobs")

#: NOTIFY payload that tells workers the queue rows changed (pause, resume, admin edit).
QUEUES_CHANGED = "pgjobs:queues"

#: Keys of a ``PGJOBS["QUEUES"]`` entry.
QUEUE_KEYS = frozenset({"max_running", "rate", "paused"})

_RATE = re.compile(r"^([1-9][0-9]{0,8})/([smh])$")
_PERIOD = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate(value: Any, where: str = "rate") -> tuple[int, float]:
    """``"N/s"`` | ``"N/m"`` | ``"N/h"`` -> (N, period in seconds); ValueError naming ``where``."""
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f'{where} must be "N/s", "N/m" or "N/h" with N a whole number '
            f'>= 1 (e.g. "100/m"), got {value!r}'
        )
    return int(match.group(1)), _PERIOD[match.group(2)]


def check_max_running(value: Any, where: str = "max_running") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise ValueError(f"{where} must be a whole number >= 1 or None, got {value!r}")
    return value


def queue_problems(queues: dict[str, Any]) -> list[str]:
    """Everything wrong with a ``PGJOBS["QUEUES"]`` value, one message per problem."""
    problems: list[str] = []
    for name, entry in queues.items():
        where = f"PGJOBS['QUEUES'][{name!r}]"
        try:
            check_queue(name)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not isinstance(entry, dict):
            problems.append(
                f"{where} must be a dict of options ({', '.join(sorted(QUEUE_KEYS))}),"
                f" got {type(entry).__name__}"
            )
            continue
        for key in entry:
            if key not in QUEUE_KEYS:
                problems.append(
                    f"{where} has unknown option {key!r}.{suggest(str(key), QUEUE_KEYS)}"
                    f" Options are: {', '.join(sorted(QUEUE_KEYS))}"
                )
        try:
            check_max_running(entry.get("max_running"), f"{where}['max_running']")
        except ValueError as exc:
            problems.append(str(exc))
        if entry.get("rate") is not None:
            try:
                parse_rate(entry["rate"], f"{where}['rate']")
            except ValueError as exc:
                problems.append(str(exc))
        if "paused" in entry and not isinstance(entry["paused"], bool):
            problems.append(f"{where}['paused'] must be True or False, got {entry['paused']!r}")
    return problems


def sync_queues(using: str | None = None) -> int:
    """Write ``PGJOBS["QUEUES"]`` into the queue rows (``migrate``, worker start).

    Settings win for the keys they name; ``paused`` is written only when given (a
    pause from the admin or ``pause_queue`` survives a deploy); queues not in the
    setting keep their rows. Returns how many entries were written.
    """
    from django_pgjobs.models import Queue

    queues = get_settings().QUEUES
    problems = queue_problems(queues)
    if problems:
        raise ValueError("; ".join(problems))
    alias = using or get_settings().DATABASE
    with transaction.atomic(using=alias):
        for name, entry in sorted(queues.items()):
            fields = {"max_running": entry.get("max_running"), "rate": entry.get("rate")}
            if "paused" in entry:
                fields["paused"] = entry["paused"]
            Queue.objects.using(alias).update_or_create(name=name, defaults=fields)
        if queues:
            notify_changed(alias)
    return len(queues)


def sync_after_migrate(*, using: str = "default", plan: Any = None, **kwargs: Any) -> None:
    """post_migrate: sync the queue rows into the migrated database (if it is ours and
    the table exists: a migrate back to zero leaves no table to write)."""
    if using != get_settings().DATABASE or not get_settings().QUEUES:
        return
    if QUEUE not in connections[using].introspection.table_names():
        return
    sync_queues(using)


def sync_queues_quietly(alias: str) -> None:
    """Worker start: sync, but a failure (say, a migration not applied yet) is a warning."""
    if not get_settings().QUEUES:
        return
    try:
        sync_queues(alias)
    except Exception as exc:  # noqa: BLE001 - the worker must start; limits stay as stored
        logger.warning("could not sync PGJOBS['QUEUES'] into the queue table: %s", exc)
        connections[alias].close_if_unusable_or_obsolete()


def notify_changed(alias: str) -> None:
    """Wake every worker to re-read the queue rows (delivered at commit)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(JOB_NOTIFY, [QUEUES_CHANGED])


def declared_queues() -> set[str]:
    """Queues the code names: ``@job(queue=...)`` defaults, ``PGJOBS["QUEUES"]`` and
    ``PGJOBS["CRON"]`` entries, and the Tasks backend's ``QUEUES`` option."""
    conf = get_settings()
    names = {d.queue for d in registry.all_definitions()}
    names |= {str(q) for q in conf.QUEUES}
    names |= {str(e.get("queue", "default")) for e in conf.CRON.values() if isinstance(e, dict)}
    names.add("default")
    try:
        from django.conf import settings

        for backend in (getattr(settings, "TASKS", None) or {}).values():
            if "pgjobs" in str(backend.get("BACKEND", "")):
                names |= {str(q) for q in backend.get("QUEUES") or ()}
    except (AttributeError, TypeError):
        pass
    return names


def check_alias(alias: str, argument: str = "using") -> str:
    """``alias`` if ``DATABASES`` has it, else a ``ValueError`` naming ``argument``."""
    known = set(connections.settings)
    if alias not in known:
        raise ValueError(
            f"{argument}: no database alias {alias!r} in DATABASES (it has "
            f"{', '.join(sorted(known))}).{suggest(alias, known)}"
        )
    return alias


def unknown_queues(names: Sequence[str], alias: str) -> list[str]:
    """The names no code declares, no queue row holds and no live job is on: most
    likely typos. Reads the database only for names the code does not declare."""
    from django_pgjobs.models import Job, Queue

    rest = [n for n in names if n not in declared_queues()]
    if not rest:
        return []
    seen = set(Queue.objects.using(alias).filter(name__in=rest).values_list("name", flat=True))
    seen |= set(
        Job.objects.using(alias)
        .filter(queue__in=set(rest) - seen)
        .exclude(status__in=TERMINAL)
        .values_list("queue", flat=True)
        .distinct()
    )
    return [n for n in rest if n not in seen]


def _set_paused(
    names: Iterable[str], paused: bool, using: str | None, create: bool = False
) -> list[str]:
    from django_pgjobs.models import Queue

    names = [check_queue(n) for n in names]
    if not names:
        raise ValueError("name at least one queue")
    alias = check_alias(using) if using is not None else get_settings().DATABASE
    unknown = [] if create else unknown_queues(names, alias)
    if unknown:
        known = declared_queues() | set(
            Queue.objects.using(alias).values_list("name", flat=True)[:1000]
        )
        hints = "".join(suggest(n, known) for n in unknown)
        verb = "pause" if paused else "resume"
        it, s = ("them", "s") if len(unknown) > 1 else ("it", "")
        raise UnknownQueue(
            f"unknown queue{s} {', '.join(map(repr, unknown))}: no @job, PGJOBS['QUEUES'] "
            f"or CRON entry names {it}, no queue row holds {it} and no job is on {it}, so "
            f"nothing was changed.{hints} To {verb} {it} anyway (a queue you are about to "
            f"use), pass create=True ({verb}_queue --create)."
        )
    with transaction.atomic(using=alias):
        for name in names:
            Queue.objects.using(alias).update_or_create(name=name, defaults={"paused": paused})
        notify_changed(alias)
        if not paused:
            # Wake idle workers of these queues: their pending jobs are claimable again.
            with connections[alias].cursor() as cursor:
                for name in names:
                    cursor.execute(JOB_NOTIFY, [name])
    return names


class UnknownQueue(ValueError):
    """``pause_queue``/``resume_queue`` named a queue nothing knows (likely a typo)."""


def pause_queue(name: str, *more: str, using: str | None = None, create: bool = False) -> list[str]:
    """Stop every worker from claiming from these queues; running jobs finish and
    enqueueing still works. Takes effect at once with LISTEN, else within POLL_INTERVAL.

    A name that no code declares, no queue row holds and no job is on raises
    ``UnknownQueue`` (with a suggestion) and nothing is written, unless ``create=True``:
    a typo must not leave the real queue running while an unused one is paused."""
    return _set_paused([name, *more], True, using, create)


def resume_queue(
    name: str, *more: str, using: str | None = None, create: bool = False
) -> list[str]:
    """Undo ``pause_queue``: workers claim from these queues again (woken by NOTIFY).
    Unknown names are refused like ``pause_queue``'s."""
    return _set_paused([name, *more], False, using, create)


@dataclass(frozen=True)
class QueueLimits:
    name: str
    paused: bool
    max_running: int | None
    rate: str | None


class FlowState:
    """One worker's view of flow control: which claim to run, with which arguments.

    Reads the limiting queue rows at most every ``refresh`` seconds (and after
    ``invalidate()``, called on a queue-change NOTIFY). One cheap query per poll
    interval per worker; nothing on the claim itself.
    """

    def __init__(
        self,
        queues: Sequence[str] | None,
        tasks: Sequence[str] | None = None,
        *,
        refresh: float | None = None,
        known_only: bool = False,
        notified: bool = False,
    ):
        self.queues = list(queues) if queues else None
        definitions = registry.all_definitions()
        names = sorted(d.name for d in definitions) if tasks is None else sorted(tasks)
        self.tasks = tuple(names)
        self.keyed = any(d.concurrency_key is not None for d in definitions if d.name in set(names))
        self._known = frozenset(names)
        # Set once a claim returned a job of a task this worker does not know (deploy
        # skew): from then on the fast path filters by task too (see claim()).
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
        self._loaded_at = time.monotonic()

    def claim_options(
        self, connection: BaseDatabaseWrapper, since: datetime | None = None
    ) -> dict[str, Any]:
        """Keyword arguments for ``claims.claim``: ``queues``, ``tasks``, ``limited``;
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

    def claim(
        self,
        connection: BaseDatabaseWrapper,
        *,
        worker: str,
        n: int,
        front: ClaimFront | None = None,
    ) -> list[Claimed]:
        """Claim up to ``n`` jobs of known tasks, from ``front``'s bound on ``run_at``
        when given (not in a limited claim: it ranks every pending job of its queues).

        The fast path is the 0.1 claim exactly, with no task filter: in steady state
        every pending job is of a known task, and the filter measurably slowed the
        hottest statement. The first job of an unknown task it meets is given back
        at once, uncounted (``job_release``), and from then on this worker claims
        with the known-task filter, so it never takes such a job again.
        """
        # The bound first: the list of queues with pending jobs is read with it.
        since = front.bound() if front is not None else None
        options = self.claim_options(connection, since)
        if options["queues"] == []:
            # Every queue of this worker is paused, or none has pending jobs.
            claimed: list[Claimed] = []
        elif front is None or options["limited"]:
            claimed = claims.claim(connection, worker=worker, n=n, **options)
        else:
            levels = front.levels()
            claimed = claims.claim(
                connection, worker=worker, n=n, since=since, levels=levels, **options
            )
            # Every row the claim took, before unknown tasks are given back below.
            # ... as epoch microseconds: the front needs the smallest only.
            run_ats = [c.run_at_us for c in claimed if c.run_at_us is not None]
            earliest = from_epoch_us(min(run_ats)) if run_ats else None
            front.took(earliest, len(run_ats), n, [c.priority for c in claimed])
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
                    worker,
                    len(unknown),
                    ", ".join(sorted({printable(c.task) for c in unknown})),
                    registry.DISCOVERY_HINT,
                )
                claimed = [c for c in claimed if c.task in self._known]
        return claimed
