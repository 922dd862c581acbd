"""Chunk handlers: ``@job(chunk=N, chunk_wait=...)`` on a function that takes one list.

A worker calls such a function once with up to N due jobs of its task, each a
``ChunkItem``; what the call returns is read per job by ``result_of``: ``None``
completes every job, a mapping of job id to an exception fails that job (retried or
dead-lettered like any failure) and to anything else completes it with that result.
Each job keeps its own attempts, lease and outcome (docs/howto/chunks.md).

This module holds what the decorator, the enqueue and the executor share: the
options' checks, the item, and the reading of a return value. The worker's side
(grouping claimed jobs, filling a chunk, the call) is ``worker/chunks.py`` and
``worker/chunk_call.py``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_pgjobs.support.validation import seconds_of

if TYPE_CHECKING:
    from django_pgjobs.jobs.context import JobContext

#: The largest ``chunk``: every item's arguments are held in memory at once, and the
#: jobs of a chunk are claimed and heartbeaten as a group.
MAX_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class ChunkItem:
    """One job of a chunk, as the handler sees it: its id (the key of its entry in a
    returned mapping), its arguments as enqueued, and with ``takes_context=True`` its
    own ``JobContext`` (None otherwise)."""

    job_id: int
    args: list[Any]
    kwargs: dict[str, Any]
    context: JobContext | None = None


def item_arguments(*args: Any, **kwargs: Any) -> None:
    """What a chunked task's enqueue checks its arguments against: one item's
    arguments, any JSON values (the handler itself takes the list)."""


class ChunkReturnError(TypeError):
    """A chunk handler returned something that is neither None nor a mapping of its
    chunk's job ids. The handler ran and its side effects happened; running it again
    cannot fix its return's shape, so the jobs are dead-lettered, not retried."""

    _pgjobs_no_retry = True  # executor.NO_RETRY, set on the class


def result_of(value: Any, job_id: int, ids: Collection[int], task: str) -> Any:
    """Job ``job_id``'s share of a chunk handler's return ``value`` (the chunk's job
    ids are ``ids``): its result (None when the mapping leaves it out); raises the
    exception mapped to it, or ``ChunkReturnError`` for a return of the wrong shape."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ChunkReturnError(
            f"the chunk handler {task} returned {type(value).__name__}; it must return None "
            "(every job completed) or a mapping of job id to an exception or a result"
        )
    strangers = [key for key in value if key not in ids or isinstance(key, bool)]
    if strangers:
        shown = ", ".join(repr(key) for key in strangers[:5])
        raise ChunkReturnError(
            f"the chunk handler {task} returned a mapping with key(s) {shown} that are not "
            "job ids of its chunk (use each item's .job_id, an int)"
        )
    mine = value.get(job_id)
    if isinstance(mine, BaseException):
        raise mine
    return mine


def check_chunk(
    func: Callable[..., Any], name: str, options: Mapping[str, Any]
) -> tuple[int | None, float]:
    """``@job``'s ``chunk`` and ``chunk_wait`` checked: (chunk, chunk_wait in seconds).
    Refuses the options a chunk cannot honour, naming the option and why."""
    chunk = options.get("chunk")
    wait = options.get("chunk_wait")
    if chunk is None:
        if wait is not None:
            raise TypeError(f"@job(chunk_wait=...) of {name} needs chunk=N as well")
        return None, 0.0
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(
            f"@job(chunk=...) of {name} must be a whole number from 1 to {MAX_CHUNK}, got {chunk!r}"
        )
    seconds = _wait_seconds(wait, name)
    if options.get("concurrency_key") is not None:
        raise TypeError(
            f"@job(chunk=...) of {name} cannot have a concurrency_key: a chunk runs many "
            "jobs in one call, which a per-key limit of running jobs cannot count"
        )
    if options.get("fair_key") is not None:
        raise TypeError(
            f"@job(chunk=...) of {name} cannot have a fair_key: a chunk is filled with its "
            "task's due jobs in priority order, not in turns across fair keys"
        )
    if options.get("atomic"):
        raise TypeError(
            f"@job(chunk=...) of {name} cannot be atomic=True: each job's completion is "
            "written apart, not in one transaction with the call (use transaction.atomic() "
            "inside the handler for the chunk's own writes)"
        )
    try:
        inspect.signature(func).bind([])
    except TypeError:
        raise TypeError(
            f"@job(chunk=...) function {name} must take one positional argument, the list "
            "of items (each item has .job_id, .args, .kwargs and, with takes_context=True, "
            ".context)"
        ) from None
    except ValueError:  # no signature to read (a builtin): let the call tell
        pass
    return chunk, seconds


def _wait_seconds(value: Any, name: str) -> float:
    if value is None:
        return 0.0
    seconds = seconds_of(value, f"@job(chunk_wait=...) of {name}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"@job(chunk_wait=...) of {name} must be zero or more seconds, got {value!r}"
        )
    return seconds
