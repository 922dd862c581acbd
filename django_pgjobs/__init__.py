"""django-pgjobs: a job queue that lives in the PostgreSQL database your Django project already runs.

This module must not import models at import time (apps may not be ready yet); the
public names below are resolved lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

__all__ = [
    "JobContext",
    "JobStatus",
    "JobTimeout",
    "__version__",
    "job",
    "pause_queue",
    "resume_queue",
]

if TYPE_CHECKING:  # pragma: no cover
    from django_pgjobs.context import JobContext
    from django_pgjobs.decorators import job
    from django_pgjobs.exceptions import JobTimeout
    from django_pgjobs.flow import pause_queue, resume_queue
    from django_pgjobs.states import JobStatus


def __getattr__(name: str) -> Any:
    if name == "job":
        from django_pgjobs.decorators import job

        return job
    if name in ("pause_queue", "resume_queue"):
        from django_pgjobs import flow

        return getattr(flow, name)
    if name == "JobStatus":
        from django_pgjobs.states import JobStatus

        return JobStatus
    if name == "JobTimeout":
        from django_pgjobs.exceptions import JobTimeout

        return JobTimeout
    if name == "JobContext":
        from django_pgjobs.context import JobContext

        return JobContext
    raise AttributeError(f"module 'django_pgjobs' has no attribute {name!r}")
