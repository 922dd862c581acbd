"""``JobContext``: what a running job may know about its own execution."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django_pgjobs.exceptions import JobCancelled


@dataclass
class JobContext:
    """Passed as the first argument to ``@job(takes_context=True)`` functions.

    ``lease`` is the fencing token of this attempt: writes made on its behalf are
    accepted only while the row still carries it. ``is_cancelled()`` turns true
    when the job is cancelled or its lease is lost (seen at the next heartbeat).
    ``parent_results``: for a workflow node, each parent node's name (default: its
    job id as a string) -> its result (None for a parent that stored none); a
    read-only mapping that reads each result when it is asked for (a plain dict in
    an async job).
    """

    job_id: int
    task: str
    attempt: int
    max_attempts: int
    lease: int
    queue: str
    idempotency_key: str | None = None
    worker: str | None = None
    parent_results: Mapping[str, Any] = field(default_factory=dict)
    # A plain flag, not a threading.Event: one is made per claimed job, and Event()
    # (a Condition and two locks) is a large share of the claim loop's work per job.
    # Setting and reading a bool is atomic under the GIL.
    _cancelled: bool = field(default=False, repr=False)

    def is_cancelled(self) -> bool:
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        if self._cancelled:
            raise JobCancelled(f"job {self.job_id} was cancelled or lost its lease")

    def cancel(self) -> None:
        """Mark cancelled (called by the worker when the row says so)."""
        self._cancelled = True
