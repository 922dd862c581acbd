"""A job's chunk run on its page: the call of a chunk handler its last outcome in a
chunk came from (``Job.chunk_run``, ``jobs/chunk_schema.py``), with its size and links
to the first ``MEMBERS_SHOWN`` jobs of that call.

Two reads of the chunk-run index, each bounded: the first members in id order (a
range of the index, ``LIMIT``), and their count, cut at ``MAX_CHUNK`` + 1 (a call has
at most ``MAX_CHUNK`` jobs; a hand-written value shared by more rows is shown as more).
"""

from __future__ import annotations

from django.urls import reverse
from django.utils.html import format_html, format_html_join

from django_pgjobs.conf import get_settings
from django_pgjobs.jobs.chunking import MAX_CHUNK
from django_pgjobs.models import Job

#: Jobs of a chunk run linked from a job's page; the others are counted.
MEMBERS_SHOWN = 50


def chunk_run_html(job: Job) -> str:
    """The chunk run of ``job`` for its page ("—" for a job that never ran in one)."""
    if job.chunk_run is None:
        return "—"
    same = Job.objects.using(get_settings().DATABASE).filter(chunk_run=job.chunk_run)
    members = list(same.order_by("id").values_list("id", "status")[:MEMBERS_SHOWN])
    size = len(members)
    if size == MEMBERS_SHOWN:
        size = same.order_by()[: MAX_CHUNK + 1].count()
    more = size - len(members)
    links = format_html_join(
        ", ",
        '<a href="{}">#{}</a>{}',
        (
            (
                reverse("admin:django_pgjobs_job_change", args=[member]),
                member,
                format_html(" ({})", status) if member != job.id else " (this job)",
            )
            for member, status in members
        ),
    )
    return format_html(
        "<p>{} {} ran in one call of the handler (chunk run <code>{}</code>):</p>"
        '<p class="pgjobs-chunk-members">{}{}</p>',
        f"{size:,}" if size <= MAX_CHUNK else f"more than {MAX_CHUNK:,}",
        "job" if size == 1 else "jobs",
        job.chunk_run,
        links,
        format_html(" and {} more", f"{more:,}") if more > 0 else "",
    )
