"""Recurring jobs: schedules, their fire times, and the leaderless ticker.

Schedules come from ``@job(cron="...")`` (named after the task, no arguments)
and from ``PGJOBS["CRON"]`` (any name, with args/kwargs/queue/priority/timezone).
Expressions are parsed and iterated by ``cronsim``: 5 fields (minute resolution,
Debian cron semantics including DST) or 6 fields with a leading seconds field;
``@hourly``-style aliases are expanded first.

The ticker needs no leader: every ``runjobs`` process computes the same fire
times and inserts each as a job with idempotency key ``cron:<name>:<fire time
UTC>`` and ``ON CONFLICT DO NOTHING``. Whichever replica comes first inserts the
row; the others insert nothing and see no error. The pg_cron engine builds the
same key (see ``pg_cron_engine.py``), so even both engines together make one job per
fire time (for minute-level schedules).

Missed fire times: while a ticker runs it enqueues every fire time since its
previous tick. After a gap (process start, database outage, suspended host:
anything longer than ``gap_after``), the fire times missed in between are
coalesced into one run, the most recent, and only if it is no older than
``CRON_CATCHUP_WINDOW``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.db import DataError, IntegrityError, connections, transaction

from django_pgjobs.conf import get_settings, suggest
from django_pgjobs.db.store import insert_params, job_insert
from django_pgjobs.jobs import registry
from django_pgjobs.support.validation import (
    check_arguments,
    check_max_attempts,
    check_priority,
    check_queue,
)

logger = logging.getLogger("django_pgjobs")

#: Aliases accepted in place of an expression (the set Vixie cron and pg_cron know).
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

#: Keys a ``PGJOBS["CRON"]`` entry may have.
ENTRY_KEYS = frozenset(
    {"task", "schedule", "args", "kwargs", "queue", "priority", "timezone", "max_attempts"}
)

#: Names become part of an idempotency key (255 chars) and of a pg_cron job name.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,199}$")

KEY_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

#: Longest schedule name whose key ``cron:<name>:<fire time, KEY_TIME_FORMAT>`` fits the
#: idempotency_key column (255 characters).
MAX_KEYED_NAME = 255 - len("cron:") - len(":") - len("2024-01-01T00:00:00Z")


class ScheduleError(ValueError):
    """A schedule is unusable. ``check_id`` is the system check that reports it."""

    def __init__(self, message: str, *, check_id: str = "django_pgjobs.E004"):
        super().__init__(message)
        self.check_id = check_id


def normalise_expression(expression: Any, where: str) -> str:
    """Expand aliases and parse once with cronsim; raise ``ScheduleError`` naming ``where``."""
    if not isinstance(expression, str) or not expression.strip():
        raise ScheduleError(
            f"{where}: the schedule must be a cron expression string, got {expression!r}"
        )
    text = " ".join(expression.split())
    text = ALIASES.get(text.lower(), text)
    if text.startswith("@"):
        raise ScheduleError(
            f"{where}: unknown alias {expression!r}; aliases are {', '.join(sorted(ALIASES))}"
        )
    fields = len(text.split())
    if fields not in (5, 6):
        raise ScheduleError(
            f"{where}: {expression!r} has {fields} fields; use 5 (minute hour day month weekday)"
            " or 6 (second minute hour day month weekday)"
        )
    try:
        next(CronSim(text, datetime(2000, 1, 1, tzinfo=UTC)))
    except CronSimError as exc:
        raise ScheduleError(f"{where}: invalid cron expression {expression!r}: {exc}") from None
    except StopIteration:
        raise ScheduleError(f"{where}: {expression!r} never fires") from None
    return text


def parse_timezone(value: Any, where: str) -> tzinfo:
    if value is None or value in ("UTC", "utc"):
        return UTC
    if not isinstance(value, str):
        raise ScheduleError(
            f"{where}: timezone must be an IANA name such as 'Europe/Paris', got {value!r}"
        )
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"{where}: unknown timezone {value!r} (use an IANA name such as 'Europe/Paris')"
        ) from None


@dataclass(frozen=True)
class Schedule:
    """One recurring job: what to enqueue, and when."""

    name: str
    task: str
    expression: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    timezone: str = "UTC"
    max_attempts: int | None = None
    source: str = "PGJOBS['CRON']"

    @property
    def zone(self) -> tzinfo:
        return parse_timezone(self.timezone, self.name)

    @property
    def has_seconds(self) -> bool:
        return len(self.expression.split()) == 6

    def fire_times(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Fire times ``t`` with ``after < t <= until``, as aware UTC datetimes."""
        it = CronSim(self.expression, after.astimezone(self.zone))
        for fire in it:
            fire_utc = fire.astimezone(UTC)
            if fire_utc > until:
                return
            if fire_utc > after:
                yield fire_utc

    def latest(self, at: datetime) -> datetime | None:
        """The most recent fire time ``<= at`` (UTC), or None if none in 50 years."""
        start = at.astimezone(self.zone).replace(microsecond=0) + timedelta(seconds=1)
        try:
            return next(CronSim(self.expression, start, reverse=True)).astimezone(UTC)
        except StopIteration:
            return None

    def upcoming(self, after: datetime, n: int = 1) -> list[datetime]:
        """The next ``n`` fire times after ``after`` (UTC)."""
        it = CronSim(self.expression, after.astimezone(self.zone))
        out: list[datetime] = []
        for fire in it:
            out.append(fire.astimezone(UTC))
            if len(out) >= n:
                break
        return out

    def key(self, fire: datetime) -> str:
        """The idempotency key of the job for one fire time: ``cron:<name>:<UTC time>``."""
        return f"cron:{self.name}:{fire.astimezone(UTC).strftime(KEY_TIME_FORMAT)}"


def _from_job(definition: Any) -> Schedule:
    where = f"@job(cron=...) of {definition.name}"
    if len(definition.name) > MAX_KEYED_NAME:
        raise ScheduleError(
            f"{where}: the name is {len(definition.name)} characters; a recurring job's "
            f"idempotency key cron:<name>:<fire time> must fit 255, so the name may have at "
            f"most {MAX_KEYED_NAME}. Give it a shorter @job(name=...) or schedule it in "
            "PGJOBS['CRON'] under a short name"
        )
    expression = normalise_expression(definition.cron, where)
    try:
        check_arguments(
            definition.checked_func,
            definition.name,
            [],
            {},
            takes_context=definition.checked_takes_context,
        )
    except TypeError as exc:
        raise ScheduleError(
            f"{where}: a @job(cron=...) function is called without arguments, but {exc}; "
            "schedule it in PGJOBS['CRON'] with args/kwargs instead"
        ) from None
    return Schedule(
        name=definition.name,
        task=definition.name,
        expression=expression,
        queue=definition.queue,
        priority=definition.priority,
        max_attempts=definition.max_attempts,
        source="@job(cron=...)",
    )


def _from_setting(name: Any, entry: Any) -> Schedule:
    where = f"PGJOBS['CRON'][{name!r}]"
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ScheduleError(
            f"{where}: a schedule name must be 1-200 characters of letters, digits and "
            "_.:@/- starting with a letter or digit"
        )
    if not isinstance(entry, dict):
        raise ScheduleError(
            f"{where} must be a dict with 'task' and 'schedule', got {type(entry).__name__}"
        )
    for key in entry:
        if key not in ENTRY_KEYS:
            raise ScheduleError(
                f"{where} has an unknown key {key!r}.{suggest(str(key), ENTRY_KEYS)}"
                f" Keys are: {', '.join(sorted(ENTRY_KEYS))}"
            )
    for key in ("task", "schedule"):
        if key not in entry:
            raise ScheduleError(f"{where} needs a {key!r}")
    expression = normalise_expression(entry["schedule"], where)
    tz = entry.get("timezone") or "UTC"
    parse_timezone(tz, where)
    task = entry["task"]
    definition = registry.find(task) if isinstance(task, str) else None
    if definition is None:
        known = [d.name for d in registry.all_definitions()]
        raise ScheduleError(
            f"{where}: unknown task {task!r}; only @job functions can be scheduled."
            f"{suggest(str(task), known)}",
            check_id="django_pgjobs.E005",
        )
    args = entry.get("args", [])
    kwargs = entry.get("kwargs", {})
    try:
        check_arguments(
            definition.checked_func,
            definition.name,
            args,
            kwargs,
            takes_context=definition.checked_takes_context,
        )
        queue = check_queue(entry.get("queue", definition.queue))
        priority = check_priority(entry.get("priority", definition.priority))
        max_attempts = entry.get("max_attempts", definition.max_attempts)
        if max_attempts is not None:
            check_max_attempts(max_attempts)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{where}: {exc}") from None
    return Schedule(
        name=name,
        task=definition.name,
        expression=expression,
        args=list(args),
        kwargs=dict(kwargs),
        queue=queue,
        priority=priority,
        timezone=tz,
        max_attempts=max_attempts,
    )


def collect_schedules(
    cron_setting: dict[str, Any] | None = None,
) -> tuple[list[Schedule], list[ScheduleError]]:
    """Every schedule, and every problem found (system checks report all of them)."""
    if cron_setting is None:
        cron_setting = get_settings().CRON
    schedules: list[Schedule] = []
    errors: list[ScheduleError] = []
    for definition in sorted(registry.all_definitions(), key=lambda d: d.name):
        if definition.cron is None:
            continue
        try:
            schedules.append(_from_job(definition))
        except ScheduleError as exc:
            errors.append(exc)
    taken = {s.name for s in schedules}
    for name, entry in cron_setting.items():
        try:
            schedule = _from_setting(name, entry)
        except ScheduleError as exc:
            errors.append(exc)
            continue
        if schedule.name in taken:
            errors.append(
                ScheduleError(
                    f"PGJOBS['CRON'][{name!r}]: the name is taken by @job(cron=...) of that task; "
                    "give the entry another name"
                )
            )
            continue
        taken.add(schedule.name)
        schedules.append(schedule)
    return schedules, errors


def usable_schedules() -> list[Schedule]:
    """Every schedule that is valid; each problem is logged (and is a system-check
    error). One bad schedule never stops the others from ticking."""
    schedules, errors = collect_schedules()
    for error in errors:
        logger.error("cron: a schedule is skipped (run manage.py check): %s", error)
    return schedules


def load_schedules() -> list[Schedule]:
    """Every schedule; raises the first ``ScheduleError`` (checks catch these at startup)."""
    schedules, errors = collect_schedules()
    if errors:
        raise errors[0]
    return schedules


def _own_transaction(connection: Any) -> Any:
    """The fire time's insert commits with its statement (autocommit): inside a BEGIN
    ... COMMIT, a worker frozen (SIGSTOP, a paused VM) between the two held the new key
    uncommitted, and every other ticker's insert of that fire time waited on it, their
    maintenance thread (and reaper) with it. Inside a caller's transaction, a savepoint
    (a row's error then leaves that transaction usable)."""
    if connection.in_atomic_block:
        return transaction.atomic(using=connection.alias)
    return contextlib.nullcontext()


class CronTicker:
    """Maintenance service: enqueue due fire times of every schedule, exactly once."""

    name = "cron"

    def __init__(
        self,
        *,
        alias: str | None = None,
        schedules: list[Schedule] | None = None,
        catchup_window: float | None = None,
        interval: float | None = None,
    ):
        conf = get_settings()
        self.alias = alias or conf.DATABASE
        self.schedules = usable_schedules() if schedules is None else schedules
        self.catchup_window = conf.CRON_CATCHUP_WINDOW if catchup_window is None else catchup_window
        self.interval = conf.CRON_INTERVAL if interval is None else interval
        self.default_max_attempts = conf.MAX_ATTEMPTS
        # A tick later than this after the previous one is a gap: coalesce what was missed.
        self.gap_after = max(3 * self.interval, 30.0)
        self.last_tick: datetime | None = None

    def due(self, now: datetime) -> list[tuple[Schedule, datetime]]:
        """The fire times to enqueue at ``now`` (see the module docstring for the policy)."""
        oldest = now - timedelta(seconds=self.catchup_window)
        last = self.last_tick
        continuous = last is not None and timedelta(0) <= now - last <= timedelta(
            seconds=self.gap_after
        )
        out: list[tuple[Schedule, datetime]] = []
        for schedule in self.schedules:
            if continuous and last is not None:
                fires = list(schedule.fire_times(max(last, oldest), now))
            else:
                latest = schedule.latest(now)
                fires = [latest] if latest is not None and latest > oldest else []
            out.extend((schedule, fire) for fire in fires)
        return out

    def run_once(self, now: datetime | None = None) -> dict[str, Any]:
        """Enqueue every due fire time; ``now`` is injectable for tests.

        Each fire time is its own transaction: a schedule whose row cannot be
        written (a data or integrity error) is logged and skipped, and the others
        still tick. Any other error (a lost connection) fails the whole pass, which
        the next tick then catches up.
        """
        now = (now or datetime.now(UTC)).astimezone(UTC)
        inserted = existing = failed = 0
        due = self.due(now)
        if due:
            connection = connections[self.alias]
            for schedule, fire in due:
                key = schedule.key(fire)
                try:
                    with _own_transaction(connection), connection.cursor() as cursor:
                        # No timeout (the @job's own, or DEFAULT_TIMEOUT) and no
                        # trace context (a schedule fires outside any trace): NULL.
                        row = job_insert(
                            cursor,
                            insert_params(
                                task=schedule.task,
                                queue=schedule.queue,
                                priority=schedule.priority,
                                args=json.dumps(schedule.args),
                                kwargs=json.dumps(schedule.kwargs),
                                run_at=fire,
                                max_attempts=schedule.max_attempts or self.default_max_attempts,
                                idempotency_key=key,
                            ),
                        )
                except (DataError, IntegrityError) as exc:  # this row's data, not the connection
                    failed += 1
                    logger.error(
                        "cron %s: could not enqueue the job for %s (the other schedules go on): %s",
                        schedule.name,
                        fire.strftime(KEY_TIME_FORMAT),
                        exc,
                        extra={"task": schedule.task},
                    )
                    continue
                if row is None:
                    existing += 1
                    continue
                inserted += 1
                logger.info(
                    "cron %s: enqueued job %s for %s",
                    schedule.name,
                    row[0],
                    fire.strftime(KEY_TIME_FORMAT),
                    extra={"job_id": row[0], "task": schedule.task},
                )
        # Only a pass that reached the database moves the mark: after a lost
        # connection, the next tick sees the gap and coalesces.
        self.last_tick = now
        return {"due": len(due), "inserted": inserted, "existing": existing, "failed": failed}
