"""Exceptions raised to users and recorded on jobs."""

from __future__ import annotations


class PgJobsError(Exception):
    """Base class of django-pgjobs' own errors."""


class UnknownTask(LookupError, PgJobsError):
    """A task name that no ``@job`` registered. The message lists close names."""


class JobCancelled(PgJobsError):
    """Recorded on a job cancelled while it ran; raised by ``JobContext.raise_if_cancelled``."""


class LeaseLost(PgJobsError):
    """A write about a job was refused because another owner holds its lease (fencing)."""


class JobTimeout(PgJobsError):
    """Recorded on a run that exceeded its timeout (``@job(timeout=...)``); the worker
    gave up on it and bumped its lease, so anything the run writes later is fenced."""


class WorkerLost(PgJobsError):
    """Recorded by the reaper on a job whose worker stopped heartbeating."""


class JobCrashed(PgJobsError):
    """Recorded on a suspect's isolated run whose process died (an exit, a signal)
    without reporting an outcome: the run is charged to the job."""


class TransactionLeftOpen(PgJobsError):
    """A job returned with a transaction still open on its connection (a raw
    ``BEGIN`` without ``COMMIT``): what it wrote since was never committed, so the
    attempt fails and the transaction is rolled back."""


class ParentResultMissing(PgJobsError):
    """Recorded on a workflow node whose parent's row, and with it the parent's
    result, is gone when the node runs (deleted by hand: the pruner keeps a parent
    while a child has not finished). A missing result is never passed on as ``None``;
    the node is dead-lettered at once, as running it again cannot bring it back."""

    #: never retried (``worker.executor.NO_RETRY``)
    _pgjobs_no_retry = True

    def __init__(self, child_id: int, parent_id: int, parent_node: str | None):
        self.child_id = child_id
        self.parent_id = parent_id
        self.parent_node = parent_node
        named = f" ({parent_node!r})" if parent_node is not None else ""
        super().__init__(
            f"job {child_id} cannot run: the result of its parent job {parent_id}{named} "
            "is gone (the parent's row was deleted before this job ran)"
        )


class CancelledOtherJobs(PgJobsError):
    """Recorded on an ``async def`` job whose code cancelled the tasks of other jobs on
    the worker's event loop: the attempt is charged to it, and the jobs it cancelled
    are given back without being charged."""


class NonDeterministic(PgJobsError):
    """A durable job's run asked for a step that contradicts its recorded history (a
    step renamed, removed or moved before steps already recorded): the job is dead
    with this error, naming the steps; fix the code (``context.patched``) and retry
    it. Never retried on its own: every run would ask the same."""

    _pgjobs_no_retry = True  # executor.NO_RETRY, on the class


class TooManySteps(PgJobsError):
    """A durable job recorded ``PGJOBS["MAX_STEPS"]`` steps and asked for one more.
    Never retried on its own: every run would ask the same."""

    _pgjobs_no_retry = True  # executor.NO_RETRY, on the class


class UnknownJob(LookupError, PgJobsError):
    """``send_signal`` to a job id that no row holds (never enqueued, or pruned)."""


class JobFinished(ValueError, PgJobsError):
    """``send_signal`` to a job that has finished (completed, dead or cancelled): no
    run would ever read the signal."""
