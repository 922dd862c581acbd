"""``@job``: turn a function into a registered, enqueueable job (``JobFunction``).

The options are validated into a ``JobDefinition`` (``jobs/definition.py``) at decoration
time, so a typo fails at import, not at 3am.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast, overload

from django.db import transaction

from django_pgjobs.conf import get_settings
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.definition import JobDefinition, make_definition
from django_pgjobs.jobs.enqueue import enqueue_batch, enqueue_one, split_call
from django_pgjobs.support.installed import require_installed
from django_pgjobs.support.validation import check_options

if TYPE_CHECKING:
    from django_pgjobs.models import Job
    from django_pgjobs.workflows.signature import Signature

P = ParamSpec("P")
R = TypeVar("R")


class JobFunction(Generic[P, R]):
    """What ``@job`` returns: still callable inline, plus ``enqueue``/``using``."""

    def __init__(self, definition: JobDefinition, call_options: dict[str, Any] | None = None):
        self.definition = definition
        self.call_options: dict[str, Any] = call_options or {}
        functools.update_wrapper(self, definition.func)

    @property
    def name(self) -> str:
        return self.definition.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """A direct call runs the function inline, as if there were no decorator."""
        return cast(R, self.definition.func(*args, **kwargs))

    def __repr__(self) -> str:
        return f"<job {self.definition.name}>"

    def using(self, **options: Any) -> JobFunction[P, R]:
        """A copy with per-call overrides: queue, priority, run_at/delay, max_attempts,
        idempotency_key, unique_key."""
        checked = check_options(options)
        merged = {**self.call_options}
        if "run_at" in checked:
            merged.pop("delay", None)
        if "delay" in checked:
            merged.pop("run_at", None)
        merged.update(checked)
        return JobFunction(self.definition, merged)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature for a workflow (``Workflow.add``, ``chain``, ``group``, ``chord``,
        ``batch``): this call with this copy's ``.using()`` options. In a chain it also
        receives the previous job's result as its first argument."""
        from django_pgjobs.workflows.signature import Signature

        return Signature(self.definition, args, kwargs, self.call_options, immutable=False)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: receives no parent result as an argument."""
        from django_pgjobs.workflows.signature import Signature

        return Signature(self.definition, args, kwargs, self.call_options, immutable=True)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Insert one job in the caller's transaction; returns the ``Job`` row."""
        from django_pgjobs.models import Job  # not at import: @job runs before apps are ready

        return enqueue_one(self.definition, list(args), dict(kwargs), self.call_options, model=Job)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """``enqueue`` for async code (views, consumers): the same insert, run in
        Django's thread for sync database work (``sync_to_async``)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.enqueue)(*args, **kwargs)

    def enqueue_many(
        self, calls: Iterable[Sequence[Any] | tuple[Sequence[Any], dict[str, Any]]]
    ) -> int:
        """Insert many jobs, one round trip per batch; returns how many were inserted.

        Each item is a tuple of positional arguments, or ``(args, kwargs)`` when
        given as a 2-tuple whose second element is a dict. A debounced job's items go
        one upsert each, in one transaction: items of one key meet on one job, and
        only the jobs this call inserted are counted.
        """
        if self.definition.debounce is None:
            return enqueue_batch(self.definition, calls, self.call_options)
        from django_pgjobs.models import Job  # not at import: see enqueue

        inserted = 0
        # A savepoint: an item that fails validation undoes the items before it and
        # leaves the caller's transaction usable (no partial rows).
        with transaction.atomic(using=get_settings().DATABASE):
            for index, item in enumerate(calls):
                args, kwargs = split_call(item, self.definition.name, index)
                try:
                    row = enqueue_one(self.definition, args, kwargs, self.call_options, model=Job)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"enqueue_many item {index}: {exc}") from None
                inserted += bool(getattr(row, "_pgjobs_inserted", False))
        return inserted


@overload
def job(func: Callable[P, R], /) -> JobFunction[P, R]: ...
@overload
def job(
    *, chunk: int, **options: Any
) -> Callable[[Callable[..., R]], JobFunction[..., R]]: ...  # enqueue takes one item's arguments
@overload
def job(**options: Any) -> Callable[[Callable[P, R]], JobFunction[P, R]]: ...


def job(func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Register ``func`` as a job. Usable bare (``@job``) or with options (``@job(queue=...)``)."""

    def decorate(f: Callable[..., Any]) -> JobFunction[Any, Any]:
        definition = make_definition(f, **options)
        require_installed(f"@job {definition.name}")
        registry.register(definition)
        return JobFunction(definition)

    if func is not None:
        return decorate(func)
    return decorate
