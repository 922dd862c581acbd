"""Queue configuration: queues as rows (pause, ``max_running``, ``rate``, the weights
of fair keys), the ``PGJOBS["QUEUES"]`` setting written into them, and the
pause/resume API.

The limits are enforced by the claim statement itself (``claim/limited.py``), so
they hold across every worker and host; a worker reads the rows that limit
something (``claim/claimant.py``) and is woken by the ``QUEUES_CHANGED`` NOTIFY
sent here whenever they change.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connections, transaction

from django_pgjobs.conf import get_settings, suggest
from django_pgjobs.db.notify import JOB_NOTIFY, QUEUES_CHANGED
from django_pgjobs.db.tables import QUEUE
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.fair_schema import weights_problems
from django_pgjobs.states import TERMINAL
from django_pgjobs.support.validation import check_queue

logger = logging.getLogger("django_pgjobs")


#: Keys of a ``PGJOBS["QUEUES"]`` entry.
QUEUE_KEYS = frozenset({"max_running", "rate", "paused", "weights"})

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
        problems.extend(weights_problems(entry.get("weights"), f"{where}['weights']"))
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
            if "weights" in entry:
                fields["weights"] = entry["weights"] or None
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
