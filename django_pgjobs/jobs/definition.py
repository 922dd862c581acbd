"""``JobDefinition``: everything the worker needs to know about a registered job, and
``make_definition``, which validates ``@job``'s options into one.

Options are validated at decoration time, so a typo fails at import, not at 3am.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django_pgjobs.conf import get_settings, suggest
from django_pgjobs.jobs import debounce as debouncing
from django_pgjobs.jobs.chunking import check_chunk, item_arguments
from django_pgjobs.jobs.keys import (
    check_concurrency,
    check_fields_exist,
    check_key_option,
    check_unique_while,
)
from django_pgjobs.support.validation import (
    check_max_attempts,
    check_priority,
    check_queue,
    check_text,
    check_timeout,
)

#: ``JobDefinition.timeout`` when ``@job`` got no ``timeout``: the setting applies.
UNSET_TIMEOUT = -1.0

#: A row's ``timeout`` for ``.using(timeout=None)``: no limit, whatever ``@job`` or
#: the setting says (NULL means "not given per call": those apply).
NO_LIMIT = math.inf


def stored_timeout(options: Mapping[str, Any]) -> float | None:
    """The ``timeout`` column for a call's checked options: NULL when not given,
    ``NO_LIMIT`` (Infinity) for an explicit ``None``."""
    if "timeout" not in options:
        return None
    value: float | None = options["timeout"]
    return NO_LIMIT if value is None else value


def row_timeout(stored: float | None) -> float | None:
    """A row's own limit: None when the row has none (NULL) or has no limit (Infinity)."""
    return None if stored is None or math.isinf(stored) else stored


JOB_OPTIONS = frozenset(
    {
        "name",
        "queue",
        "priority",
        "max_attempts",
        "atomic",
        "takes_context",
        "cron",
        "retry_on",
        "discard_on",
        "timeout",
        "concurrency_key",
        "concurrency_limit",
        "fair_key",
        "unique_while",
        "chunk",
        "chunk_wait",
        *debouncing.OPTIONS,
    }
)


@dataclass(frozen=True)
class JobDefinition:
    """Everything the worker needs to know about a registered job."""

    name: str
    func: Callable[..., Any]
    queue: str = "default"
    priority: int = 0
    max_attempts: int | None = None  # None: PGJOBS["MAX_ATTEMPTS"] at enqueue time
    atomic: bool = False
    takes_context: bool = False
    cron: str | None = None
    retry_on: tuple[type[BaseException], ...] = ()
    discard_on: tuple[type[BaseException], ...] = ()
    is_async: bool = False
    #: seconds a run may take; None: no limit; UNSET_TIMEOUT: PGJOBS["DEFAULT_TIMEOUT"]
    timeout: float | None = -1.0
    extra: dict[str, Any] = field(default_factory=dict)
    # Flow control (claim/limited.py, keys.py): computed at enqueue, stored on the row.
    concurrency_key: str | Callable[..., Any] | None = None
    concurrency_limit: int = 1
    unique_while: str | None = None  # "pending" | "active"
    # Fair shares (claim/fair.py): the key whose jobs share a queue's claims fairly.
    fair_key: str | Callable[..., Any] | None = None
    #: Chunk handlers (chunking.py): at most this many jobs of the task per call
    #: (None: one job per call), and how long the worker waits to fill a chunk.
    chunk: int | None = None
    chunk_wait: float = 0.0

    @property
    def checked_func(self) -> Callable[..., Any]:
        """What an enqueue's arguments are checked against: the function, or for a
        chunk handler (which takes the list of items) any one item's arguments."""
        return item_arguments if self.chunk is not None else self.func

    @property
    def checked_takes_context(self) -> bool:
        """Whether ``checked_func``'s first parameter is the context (never an item's)."""
        return self.takes_context and self.chunk is None

    # debounce.py: an enqueue while a job of its key is pending moves that job on
    debounce: debouncing.Debounce | None = None

    def effective_timeout(self, stored: float | None) -> float | None:
        """The limit of one run: the row's own (``.using(timeout=...)``), else the
        ``@job`` option, else ``PGJOBS["DEFAULT_TIMEOUT"]``."""
        if stored is not None:
            return row_timeout(stored)
        if self.timeout != UNSET_TIMEOUT:
            return self.timeout
        return get_settings().DEFAULT_TIMEOUT

    def should_retry(self, exc: BaseException) -> bool:
        """``discard_on`` wins; with ``retry_on`` set only those exceptions retry."""
        if self.discard_on and isinstance(exc, self.discard_on):
            return False
        if self.retry_on:
            return isinstance(exc, self.retry_on)
        return True


def _exception_classes(value: Any, option: str) -> tuple[type[BaseException], ...]:
    items = (value,) if isinstance(value, type) else tuple(value or ())
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"@job({option}=...) takes exception classes, got {item!r}")
    return items


def make_definition(func: Callable[..., Any], **options: Any) -> JobDefinition:
    for key in options:
        if key not in JOB_OPTIONS:
            raise TypeError(
                f"@job got an unknown option {key!r}.{suggest(key, JOB_OPTIONS)} "
                f"Options are: {', '.join(sorted(JOB_OPTIONS))}"
            )
    if not callable(func):
        raise TypeError(f"@job decorates a function, got {func!r}")
    qualname = getattr(func, "__qualname__", "")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise TypeError(
            f"@job functions must be defined at module level, got {func.__module__}.{qualname}"
        )
    name = options.get("name") or f"{func.__module__}.{qualname}"
    if not isinstance(name, str) or len(name) > 255:
        raise ValueError(f"@job(name=...) must be a string of at most 255 characters, got {name!r}")
    try:  # every row, error entry and worker row names it: text PostgreSQL can store
        check_text(name, "the task name (@job(name=...) or module.qualname)")
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    takes_context = bool(options.get("takes_context", False))
    if takes_context:
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(
                f"@job(takes_context=True) function {name} needs a first parameter for the JobContext"
            )
    cron = options.get("cron")
    if cron is not None and (not isinstance(cron, str) or not cron.strip()):
        raise ValueError(f"@job(cron=...) must be a cron expression string, got {cron!r}")
    max_attempts = options.get("max_attempts")
    concurrency_key, concurrency_limit = check_concurrency(
        options.get("concurrency_key"), options.get("concurrency_limit"), name
    )
    chunk, chunk_wait = check_chunk(func, name, options)
    definition = JobDefinition(
        name=name,
        func=func,
        queue=check_queue(options.get("queue", "default")),
        priority=check_priority(options.get("priority", 0)),
        max_attempts=None if max_attempts is None else check_max_attempts(max_attempts),
        atomic=bool(options.get("atomic", False)),
        takes_context=takes_context,
        cron=cron,
        retry_on=_exception_classes(options.get("retry_on"), "retry_on"),
        discard_on=_exception_classes(options.get("discard_on"), "discard_on"),
        is_async=inspect.iscoroutinefunction(func),
        timeout=check_timeout(options["timeout"], "@job(timeout=...)")
        if "timeout" in options
        else UNSET_TIMEOUT,
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit,
        unique_while=check_unique_while(options.get("unique_while")),
        fair_key=check_key_option(options.get("fair_key"), "fair_key", name),
        chunk=chunk,
        chunk_wait=chunk_wait,
        debounce=debouncing.check_debounce(options, f"@job {name}"),
    )
    check_fields_exist(definition)
    if definition.debounce is not None:
        debouncing.check_fields_exist(definition, definition.debounce)
    return definition
