"""The column that records a chunk run (``@job(chunk=N)``): which jobs ran together in
one call of their handler, for the job page (``admin/chunk_runs.py``).

``Job.chunk_run`` names the call: an id the worker makes for each call of a chunk's
handler (``worker/chunk_call.py``), written with each job's outcome by that outcome's
own statement (``db/job_outcome.py``), so it costs no write of its own and a plain
job's completion never touches it. A later run of the job writes its own call's id.

The index is partial on rows that ran in a chunk, and ends in ``id``: the job page
reads one run's first members in id order and counts them (at most ``chunk``), so
both read a bounded range of the index; a project without chunked tasks keeps it
empty, and a plain job's writes never enter it.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q

#: The job page's read of a chunk run's members.
CHUNK_RUN_INDEX = models.Index(
    fields=["chunk_run", "id"],
    name="pgjobs_job_chunk_run_idx",
    condition=Q(chunk_run__isnull=False),
)


def chunk_run_field() -> models.UUIDField[Any, Any]:
    """``Job.chunk_run``: the call of a chunk's handler whose outcome the job's row holds."""
    return models.UUIDField(
        null=True,
        blank=True,
        editable=False,
        help_text="the chunk run (one call of a chunk handler) its last outcome came from",
    )
