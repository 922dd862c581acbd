"""Retry and cancel a selection of jobs: the one home of what ``Job.objects.filter(...)
.retry()`` / ``.cancel()``, the admin's actions and the ``retry_jobs`` /
``cancel_jobs`` commands do.

A selection is a queryset (its ids read in ascending keyset pages, so a huge
selection never sits in memory) or a list of ids (the admin's ticked rows). Each
chunk of at most ``CHUNK`` ids is one lease-fenced statement of ``db/job_admin.py`` that
re-checks every row's state, so a job that moved on meanwhile is left alone and a
worker still running a retried or cancelled job is fenced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, router
from django.db.models import QuerySet

from django_pgjobs.conf import get_settings
from django_pgjobs.db import store

if TYPE_CHECKING:
    from django_pgjobs.models import Job

logger = logging.getLogger("django_pgjobs")

#: Most ids one fenced retry/cancel statement receives (it locks them in id order).
CHUNK = 1_000

#: Jobs to change: a queryset, or ids (in the order given).
Selection = QuerySet["Job"] | Sequence[int]


def retry(
    selection: Selection, *, using: str | None = None, stale_after: float | None = None
) -> store.Retried:
    """Put the selected dead, cancelled or stuck (heartbeat older than ``stale_after``,
    default ``STALE_AFTER``) jobs back to pending, due now, attempts reset, lease
    bumped. A job whose ``unique_while`` key another pending or running job holds is
    skipped and logged (docs/reference/api.md: like a second enqueue of the key, its retry writes
    nothing): ``.held`` maps it to the holder. ``using``: the database of a list of
    ids (default ``PGJOBS["DATABASE"]``; a queryset says its own)."""
    seconds = get_settings().STALE_AFTER if stale_after is None else stale_after
    held: dict[int, int] = {}

    def statement(connection: Any, ids: list[int]) -> set[int]:
        result = store.job_retry_now(connection, ids, stale_after=seconds)
        held.update(result.held)
        return result.changed

    changed = _each_chunk(selection, using, statement)
    for job_id, holder in sorted(held.items()):
        logger.warning("job #%d not retried: its unique key is held by job #%d", job_id, holder)
    return store.Retried(changed, held)


def cancel(selection: Selection, *, using: str | None = None) -> set[int]:
    """Cancel the selected pending or running jobs (lease bumped, so a running job's
    result is rejected and its ``context.is_cancelled()`` turns true); returns the
    ids that changed."""
    return _each_chunk(selection, using, store.job_cancel)


def _each_chunk(
    selection: Selection, using: str | None, statement: Callable[[Any, list[int]], set[int]]
) -> set[int]:
    if isinstance(selection, QuerySet):
        # Where the queryset would write (Django's QuerySet.update rule).
        hints = getattr(selection, "_hints", {})
        alias = getattr(selection, "_db", None) or router.db_for_write(selection.model, **hints)
        chunks = _queryset_chunks(selection)
    else:
        alias = using or get_settings().DATABASE
        chunks = _list_chunks(selection)
    connection = connections[alias]
    changed: set[int] = set()
    for ids in chunks:
        changed |= statement(connection, ids)
    return changed


def _list_chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), CHUNK):
        yield list(ids[start : start + CHUNK])


def _queryset_chunks(queryset: QuerySet[Job]) -> Iterator[list[int]]:
    """The queryset's ids in ascending chunks (keyset pagination: each chunk is a
    fresh query)."""
    if queryset.query.is_sliced:  # .filter(...)[:10].retry(): take the slice as given
        yield from _list_chunks(sorted(queryset.values_list("id", flat=True)))
        return
    base = queryset.order_by().values_list("id", flat=True)
    last = None
    while True:
        page = base.filter(id__gt=last) if last is not None else base
        ids = list(page.order_by("id")[:CHUNK])
        if not ids:
            return
        yield ids
        last = ids[-1]
