"""The job detail page: read-only, and never loading a big value whole.

Arguments, result and errors come as heads the database cuts (``json_head``: the
first ``DETAIL_CHARS`` characters and the size), so a 50 MB argument never reaches
Python or the page; the error history shows the newest ``MAX_ERRORS_KEPT`` entries.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import BigIntegerField, Func, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Left
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from django_pgjobs.admin.chunk_runs import chunk_run_html
from django_pgjobs.admin.job_list import LIST_DEFERRED, MAX_ID
from django_pgjobs.admin.workflows import run_link
from django_pgjobs.conf import get_settings
from django_pgjobs.db.reports import ERRORS_NEWEST, ERRORS_TOTAL
from django_pgjobs.db.store import NO_LIMIT as NO_LIMIT_SQL
from django_pgjobs.durable.models import JobStep
from django_pgjobs.jobs import debounce as debouncing
from django_pgjobs.models import Job, JobResult, StoredJSONField
from django_pgjobs.states import JobStatus
from django_pgjobs.support import decoding
from django_pgjobs.support.ages import format_age
from django_pgjobs.support.decoding import Undecodable

#: Characters of a JSON value (args, kwargs, result) or of an error text shown on
#: the detail page; longer values are cut with a note saying how large they are.
DETAIL_CHARS = 64 * 1024
#: A durable job's steps listed on its page, and the characters of each result shown.
STEPS_SHOWN = 100
STEP_HEAD_CHARS = 200
#: A wait without a time limit parks the job with run_at at this far date (db/durable.py).
NO_LIMIT = datetime.fromisoformat(NO_LIMIT_SQL)


def cut(value: Any, limit: int = DETAIL_CHARS) -> str:
    """Text for the page, at most ``limit`` characters (a note says when it was cut)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… truncated: {len(text):,} characters in all"


def pretty(value: Any) -> str:
    try:
        text = json.dumps(value, indent=2, sort_keys=True, default=str)
    except (ValueError, RecursionError):  # a hostile row: huge ints, absurd nesting
        text = repr(value)[:DETAIL_CHARS]
    return format_html('<pre class="pgjobs-json">{}</pre>', text)


def pretty_text(head: str | None, size: int | None) -> str:
    """A JSON value read as its first ``DETAIL_CHARS`` characters and its size in
    bytes (``json_head``): pretty-printed when it is all there, else shown as it is
    stored, cut, with a note."""
    if head is None:
        return "—"
    total = size or 0
    if total <= DETAIL_CHARS:
        value = decoding.loads(head)  # absurd nesting too, on every Python
        if not isinstance(value, Undecodable):
            return pretty(value)
        # stored by psql or an old version: show the text
    more = total - len(head.encode())
    note = (
        format_html(
            '<p class="pgjobs-truncated">… truncated: {} bytes in all, the first {} shown.</p>',
            f"{total:,}",
            f"{len(head.encode()):,}",
        )
        if more > 0
        else ""
    )
    return format_html('<pre class="pgjobs-json">{}</pre>{}', head, note)


def json_head(column: str) -> tuple[Left, Func]:
    """The first ``DETAIL_CHARS`` characters of a jsonb column, and its size in bytes,
    computed by the database (the value itself is never loaded)."""
    as_text = Cast(column, TextField())
    return Left(as_text, DETAIL_CHARS), Func(
        as_text, function="octet_length", output_field=BigIntegerField()
    )


class JobDetail(admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    """The detail part of ``JobAdmin`` (``jobs.py``): its fields, all read-only."""

    change_form_template = "admin/django_pgjobs/job/change_form.html"
    fieldsets = (
        (None, {"fields": ("id", "task", "queue", "priority", "status_badge", "idempotency_key")}),
        (
            "Flow control",
            {
                "fields": ("concurrency_key", "concurrency_limit", "unique_key"),
                "classes": ("collapse",),
            },
        ),
        # Workflows: admin/workflows.py shows the run.
        (
            "Workflow",
            {
                "fields": ("workflow_link", "node", "waiting", "failed_parents", "cancelled_by"),
                "classes": ("collapse",),
            },
        ),
        # Chunk handlers: the jobs it ran with in one call (admin/chunk_runs.py).
        ("Chunk run", {"fields": ("chunk_run_display",), "classes": ("collapse",)}),
        # Durable jobs (durable/): what it waits for, and its recorded steps.
        ("Durable", {"fields": ("waiting_for_display", "steps_table"), "classes": ("collapse",)}),
        ("Arguments", {"fields": ("args_pretty", "kwargs_pretty")}),
        ("Result", {"fields": ("result_pretty",)}),
        ("Errors", {"fields": ("last_error_full", "error_history")}),
        (
            "Lease and worker",
            {
                "fields": (
                    "attempts_display",
                    "lease",
                    "worker",
                    "heartbeat_at",
                    "heartbeat_age",
                    "suspect",  # reclaimed from a lost worker: runs alone (worker/isolated.py)
                )
            },
        ),
        (
            "Timings",
            {
                "fields": (
                    "created_at",
                    "run_at",
                    "debounce_note",  # a debounced job's run_at moves on (debounce.py)
                    "started_at",
                    "finished_at",
                    "waited",
                    "ran_for",
                )
            },
        ),
    )

    #: Every field of the page (each on its own line): a job is never edited by hand.
    readonly_fields = tuple(
        name for _, options in fieldsets for name in options["fields"] if isinstance(name, str)
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """A workflow node's page shows its "Workflow" section open: the link to its
        run's graph is one click away; a waiting job's page its "Durable" section; a
        job that ran in a chunk its "Chunk run"."""
        opened = set()
        if obj is not None and obj.workflow_id is not None:
            opened.add("Workflow")
        if obj is not None and obj.chunk_run is not None:
            opened.add("Chunk run")
        if obj is not None and obj.status == JobStatus.WAITING:
            opened.add("Durable")
        return tuple(
            (name, {**options, "classes": ()}) if name in opened else (name, options)
            for name, options in self.fieldsets
        )

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Job | None:
        """The job for the detail page, without its big columns: arguments, result
        and errors come as bounded heads computed by the database (see json_head)."""
        if from_field is not None:
            return super().get_object(request, object_id, from_field)
        try:
            pk = Job._meta.pk.to_python(object_id)
        except (ValidationError, ValueError):
            return None
        if not isinstance(pk, int) or not 0 < pk <= MAX_ID:
            return None
        args_head, args_bytes = json_head("args")
        kwargs_head, kwargs_bytes = json_head("kwargs")
        keep = get_settings().MAX_ERRORS_KEPT
        job: Job | None = (
            self.get_queryset(request)
            .defer(*LIST_DEFERRED)
            .annotate(
                args_head=args_head,
                args_bytes=args_bytes,
                kwargs_head=kwargs_head,
                kwargs_bytes=kwargs_bytes,
                last_error_head=Left("last_error", DETAIL_CHARS),
                # constants of db/reports.py; the one value is a parameter
                errors_total=RawSQL(ERRORS_TOTAL, [], output_field=BigIntegerField()),  # noqa: S611
                errors_newest=RawSQL(ERRORS_NEWEST, [keep], output_field=StoredJSONField()),  # noqa: S611
            )
            .filter(pk=pk)
            .first()
        )
        return job

    @admin.display(description="debounced")
    def debounce_note(self, obj: Job) -> str:
        """Whether an enqueue of its key still moves this job's run_at on, and how far
        it may: the planned time above is run_at, the bound first enqueue + max_wait."""
        until = obj.debounce_until
        if until is None:
            return "no"
        bound = (
            "no max_wait"
            if debouncing.unbounded(obj.created_at, until)
            else f"never later than {timezone.localtime(until):%Y-%m-%d %H:%M:%S %Z} "
            "(its first enqueue + max_wait)"
        )
        if obj.status == JobStatus.PENDING and obj.unique_key is not None:
            return f"yes: each enqueue of its key moves run_at on by the debounce, {bound}"
        return f"it was; it has started, so an enqueue of its key makes a new job ({bound})"

    @admin.display(description="workflow")
    def workflow_link(self, obj: Job) -> str:
        return run_link(obj.workflow_id)

    @admin.display(description="chunk run")
    def chunk_run_display(self, obj: Job) -> str:
        return chunk_run_html(obj)

    @admin.display(description="args")
    def args_pretty(self, obj: Job) -> str:
        if hasattr(obj, "args_head"):
            return pretty_text(obj.args_head, getattr(obj, "args_bytes", None))
        return pretty(obj.args)

    @admin.display(description="kwargs")
    def kwargs_pretty(self, obj: Job) -> str:
        if hasattr(obj, "kwargs_head"):
            return pretty_text(obj.kwargs_head, getattr(obj, "kwargs_bytes", None))
        return pretty(obj.kwargs)

    @admin.display(description="result")
    def result_pretty(self, obj: Job) -> str:
        head, size = json_head("value")
        row = (
            JobResult.objects.using(get_settings().DATABASE)
            .filter(job_id=obj.id)
            .annotate(head=head, size=size)
            .values_list("head", "size")
            .first()
        )
        if row is None:
            return "no stored result" if obj.status == JobStatus.COMPLETED else "—"
        return pretty_text(*row)

    @admin.display(description="last error")
    def last_error_full(self, obj: Job) -> str:
        text = getattr(obj, "last_error_head", None)
        if text is None and "last_error" not in obj.get_deferred_fields():
            text = obj.last_error
        return format_html("<pre>{}</pre>", cut(text)) if text else "—"

    @admin.display(description="error history")
    def error_history(self, obj: Job) -> str:
        if hasattr(obj, "errors_newest"):
            errors, total = obj.errors_newest, getattr(obj, "errors_total", 0)
        else:
            errors = obj.errors if isinstance(obj.errors, list) else []
            total = len(errors)
        if isinstance(errors, Undecodable):  # a hostile row: say so, do not fail the page
            return format_html("<pre>{}</pre>", errors)
        errors = errors if isinstance(errors, list) else []
        if not errors:
            return "no failed attempts"
        older = total - len(errors)
        note = (
            format_html('<p class="pgjobs-truncated">{} older entries not shown.</p>', older)
            if older > 0
            else ""
        )
        return (
            format_html_join(
                "",
                '<div class="pgjobs-error"><p><strong>attempt {}</strong> at {} on {}: '
                "<code>{}</code>: {}</p><pre>{}</pre></div>",
                (
                    (
                        cut(e.get("attempt", "?")),
                        cut(e.get("at", "?")),
                        cut(e.get("worker") or "?"),
                        cut(e.get("type", "Error")),
                        cut(e.get("message", "")),
                        cut(
                            e.get("traceback")
                            or "(no traceback: recorded by the reaper or an admin)"
                        ),
                    )
                    for e in reversed(errors)
                    if isinstance(e, dict)
                ),
            )
            + note
        )

    @admin.display(description="waiting for")
    def waiting_for_display(self, obj: Job) -> str:
        if obj.status != JobStatus.WAITING:
            return "—"
        what = obj.waiting_for if isinstance(obj.waiting_for, dict) else {}
        until = (
            "no time limit"
            if obj.run_at >= NO_LIMIT
            else f"until {obj.run_at:%Y-%m-%d %H:%M:%S %Z}"
        )
        kind = cut(what.get("kind", "?"), 100)
        name = cut(what.get("name", "?"), 300)
        key = what.get("key")
        return format_html(
            "{} <code>{}</code>{} ({})",
            kind,
            name,
            format_html(" key <code>{}</code>", cut(key, 300)) if key is not None else "",
            until,
        )

    @admin.display(description="steps")
    def steps_table(self, obj: Job) -> str:
        rows = list(
            JobStep.objects.using(get_settings().DATABASE)
            .filter(job_id=obj.id)
            .order_by("seq")
            .annotate(head=Left(Cast("result", TextField()), STEP_HEAD_CHARS))
            .values_list("seq", "name", "occurrence", "kind", "created_at", "head")[
                : STEPS_SHOWN + 1
            ]
        )
        if not rows:
            return "no recorded steps"
        more = (
            format_html(
                '<p class="pgjobs-truncated">only the first {} steps shown.</p>', STEPS_SHOWN
            )
            if len(rows) > STEPS_SHOWN
            else ""
        )
        table = format_html(
            "<table><tr><th>#</th><th>name</th><th>kind</th><th>recorded</th>"
            "<th>result</th></tr>{}</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td><code>{}</code>{}</td><td>{}</td><td>{}</td>"
                "<td><code>{}</code></td></tr>",
                (
                    (
                        seq,
                        name,
                        f" (call {occurrence + 1})" if occurrence else "",
                        kind,
                        f"{created:%Y-%m-%d %H:%M:%S}",
                        "—" if head is None else cut(head, STEP_HEAD_CHARS),
                    )
                    for seq, name, occurrence, kind, created, head in rows[:STEPS_SHOWN]
                ),
            ),
        )
        return format_html("{}{}", table, more)

    @admin.display(description="waited in queue")
    def waited(self, obj: Job) -> str:
        if obj.started_at is None:
            return "—"
        return format_age(obj.started_at - max(obj.run_at, obj.created_at))

    @admin.display(description="ran for")
    def ran_for(self, obj: Job) -> str:
        if obj.started_at is None:
            return "—"
        end = obj.finished_at or (timezone.now() if obj.status == JobStatus.RUNNING else None)
        return format_age(end - obj.started_at) if end else "—"
