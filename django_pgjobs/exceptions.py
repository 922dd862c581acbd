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
