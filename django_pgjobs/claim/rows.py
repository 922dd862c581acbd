"""What a claimed row becomes: ``Claimed``, the job as the worker sees it from its
claim to its outcome, decoded per row from what every claim statement returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_pgjobs.db.cursor import json_value_or_placeholder
from django_pgjobs.db.epoch import from_epoch_us
from django_pgjobs.support.decoding import Undecodable


@dataclass(slots=True)
class Claimed:
    """A claimed job as the worker sees it (no model instance on the hot path).

    Read-only by convention, not ``frozen``: a frozen dataclass sets each of its 15
    fields through ``object.__setattr__``, several times slower than a slots dataclass,
    and the claim thread builds one per claimed job: on a no-op drain ``from_rows`` is
    a large part of that thread's time."""

    id: int
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    max_attempts: int
    lease: int
    queue: str
    priority: int
    idempotency_key: str | None
    timeout: float | None = None
    trace_context: dict[str, str] | None = None  # W3C trace context stored at enqueue
    has_parents: bool = False  # a workflow job with parents (their results are read)
    suspect: bool = False  # reclaimed from a lost worker: run alone (worker/isolated.py)
    #: when it was due, as epoch microseconds (``run_at`` converts): the claim front
    #: reads only the smallest of a claim's (front.py)
    run_at_us: int | None = None
    #: the call of a chunk handler it runs in (``chunk_call.py``): its outcome's write
    #: records it (``Job.chunk_run``); None for a job run alone
    chunk_run: str | None = None

    @property
    def run_at(self) -> datetime | None:
        return from_epoch_us(self.run_at_us)


def from_rows(rows: Sequence[Sequence[Any]]) -> list[Claimed]:
    # Django's psycopg setup loads jsonb as text (it decodes JSON in the ORM).
    # Decoded per row: one undecodable row fails its own job, not the batch (nothing
    # here may raise: the claim has committed, and a raise would strand every row).
    # In the claim's order (priority DESC, run_at, id): UPDATE ... RETURNING gives its
    # rows in the order it met them in the heap, and the worker starts a batch's jobs
    # in list order (a higher priority runs first, within a batch too).
    claimed = [
        Claimed(
            r[0],
            r[1],
            _decoded(r[2]),
            _decoded(r[3]),
            r[4],
            r[5],
            r[6],
            r[7],
            r[8],
            r[9],
            r[10],
            _trace_context(r[11]),
            r[12],
            r[13],
            r[14],
        )
        for r in rows
    ]
    claimed.sort(key=_claim_order)
    return claimed


def _claim_order(job: Claimed) -> tuple[int, int, int]:
    # no run_at: one Python cannot hold, which was due (year 1 and the like): first
    due = job.run_at_us if job.run_at_us is not None else -(2**63)
    return (-job.priority, due, job.id)


def _decoded(value: Any) -> Any:
    """A stored args/kwargs value, or an ``Undecodable`` placeholder (a number of more
    than 4,300 digits, nesting deeper than the recursion limit): the executor
    dead-letters that job alone, with the placeholder's reason."""
    return json_value_or_placeholder(value)


def _trace_context(value: Any) -> dict[str, str] | None:
    """The stored W3C trace context, as a dict of strings; None when absent, not a
    JSON object or undecodable, and only its string items otherwise (a trace is
    never worth failing a job for: ``{"traceparent": 5}`` made the propagator raise
    TypeError before the handler ran)."""
    if value is None:
        return None
    decoded = json_value_or_placeholder(value)
    if not isinstance(decoded, dict) or isinstance(decoded, Undecodable):
        return None
    return {k: v for k, v in decoded.items() if isinstance(k, str) and isinstance(v, str)}
