"""django-pgjobs: a job queue that lives in the PostgreSQL database your Django project already runs.

This module must not import models at import time (apps may not be ready yet); the
public names below are resolved lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_pgjobs.version import __version__

__all__ = [
    "ChunkItem",
    "JobContext",
    "JobStatus",
    "JobTimeout",
    "NonDeterministic",
    "Signature",
    "Workflow",
    "WorkflowRun",
    "__version__",
    "batch",
    "cancel_workflow",
    "chain",
    "chord",
    "durable",
    "emit_event",
    "group",
    "job",
    "pause_queue",
    "resume_queue",
    "send_signal",
]

#: Workflows and batches, from django_pgjobs.workflows.
_WORKFLOW_NAMES = frozenset(
    {"Signature", "Workflow", "WorkflowRun", "batch", "cancel_workflow", "chain", "chord", "group"}
)

if TYPE_CHECKING:  # pragma: no cover
    from django_pgjobs.decorators import job
    from django_pgjobs.durable.events import emit_event
    from django_pgjobs.durable.signals import send_signal
    from django_pgjobs.exceptions import JobTimeout, NonDeterministic
    from django_pgjobs.jobs.chunking import ChunkItem
    from django_pgjobs.jobs.context import JobContext
    from django_pgjobs.queues import pause_queue, resume_queue
    from django_pgjobs.states import JobStatus
    from django_pgjobs.workflows import (
        Signature,
        Workflow,
        WorkflowRun,
        batch,
        cancel_workflow,
        chain,
        chord,
        group,
    )


def __getattr__(name: str) -> Any:
    if name == "job":
        from django_pgjobs.decorators import job

        return job
    if name in ("pause_queue", "resume_queue"):
        from django_pgjobs import queues

        return getattr(queues, name)
    if name == "JobStatus":
        from django_pgjobs.states import JobStatus

        return JobStatus
    if name in ("JobTimeout", "NonDeterministic"):
        from django_pgjobs import exceptions

        return getattr(exceptions, name)
    if name == "durable":  # durable(context) of a Django task: the package, callable
        import importlib

        return importlib.import_module("django_pgjobs.durable")
    if name == "JobContext":
        from django_pgjobs.jobs.context import JobContext

        return JobContext
    if name == "send_signal":
        from django_pgjobs.durable.signals import send_signal

        return send_signal
    if name == "emit_event":
        from django_pgjobs.durable.events import emit_event

        return emit_event
    if name == "ChunkItem":
        from django_pgjobs.jobs.chunking import ChunkItem

        return ChunkItem
    if name in _WORKFLOW_NAMES:
        from django_pgjobs import workflows

        return getattr(workflows, name)
    raise AttributeError(f"module 'django_pgjobs' has no attribute {name!r}")
