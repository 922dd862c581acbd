"""The admin: find stuck and dead-lettered jobs, retry or cancel them, read the overview.

Rules this module keeps, so the admin stays safe and quick on millions of rows:

* **No hand edits.** Jobs cannot be added, edited or deleted here; the detail page
  is read-only. Every state change goes through the lease-fenced statements of
  ``sql.py`` (the ones the worker and reaper use) — never ``obj.save()`` — so an
  admin retry or cancel fences a worker still running the job.
* **No full counts.** The list counts at most ``COUNT_CAP`` matching rows (and
  shows PostgreSQL's row estimate for the whole table), facets are off, and the
  queue/task filter choices come from the registry plus a loose index scan of the
  pending rows, never from ``SELECT DISTINCT`` over the history.
* **Indexed filters.** Status filters use ``(status, -id)``, "stuck" the partial
  running index, "due" the partial claim index; ordering is always ``-id``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import BigIntegerField, Func, JSONField, Q, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Left
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme

from django_pgjobs import registry, sql
from django_pgjobs.admin import charts
from django_pgjobs.ages import format_age
from django_pgjobs.conf import get_settings
from django_pgjobs.health import overview as overview_queries
from django_pgjobs.maintenance.reaper import Reaper
from django_pgjobs.managers import JobQuerySet
from django_pgjobs.models import Job, JobResult, Worker
from django_pgjobs.states import JobStatus

#: The list counts at most this many matching rows ("more than 10,000 jobs").
COUNT_CAP = 10_000
#: An action on "all matching jobs" touches at most this many rows per click.
ACTION_LIMIT = 10_000
#: Rows per admin action statement (each statement locks its rows in id order).
ACTION_CHUNK = 1_000
#: Largest job id (bigint): a ticked or searched number above it matches nothing.
MAX_ID = 2**63 - 1
#: Characters of a JSON value (args, kwargs, result) or of an error text shown on
#: the detail page; longer values are cut with a note saying how large they are.
DETAIL_CHARS = 64 * 1024
#: Characters of ``last_error`` loaded for the list (its first line is shown).
LIST_ERROR_CHARS = 400
#: Columns the list never loads: a page of 100 rows must not read 100 argument sets.
LIST_DEFERRED = ("args", "kwargs", "errors", "last_error")


def _alias() -> str:
    return get_settings().DATABASE


def _age(since: datetime | None, now: datetime | None = None) -> timedelta | None:
    if since is None:
        return None
    return (now or timezone.now()) - since


def _cut(value: Any, limit: int = DETAIL_CHARS) -> str:
    """Text for the page, at most ``limit`` characters (a note says when it was cut)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… truncated: {len(text):,} characters in all"


def _is_job_id(text: str) -> bool:
    """ASCII digits of a bigint ("²".isdigit() is True, but int("²") raises)."""
    return text.isascii() and text.isdigit() and len(text) <= 19 and 0 < int(text) <= MAX_ID


def _pretty(value: Any) -> str:
    try:
        text = json.dumps(value, indent=2, sort_keys=True, default=str)
    except (ValueError, RecursionError):  # a hostile row: huge ints, absurd nesting
        text = repr(value)[:DETAIL_CHARS]
    return format_html('<pre class="pgjobs-json">{}</pre>', text)


def _pretty_text(head: str | None, size: int | None) -> str:
    """A JSON value read as its first ``DETAIL_CHARS`` characters and its size in
    bytes (``_json_head``): pretty-printed when it is all there, else shown as it is
    stored, cut, with a note. A 50 MB argument never reaches Python or the page."""
    if head is None:
        return "—"
    total = size or 0
    if total <= DETAIL_CHARS:
        try:
            return _pretty(json.loads(head))
        except (ValueError, RecursionError):
            pass  # stored by psql or an old version: show the text
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


def _json_head(column: str) -> tuple[Left, Func]:
    """The first ``DETAIL_CHARS`` characters of a jsonb column, and its size in bytes,
    computed by the database (the value itself is never loaded)."""
    as_text = Cast(column, TextField())
    return Left(as_text, DETAIL_CHARS), Func(
        as_text, function="octet_length", output_field=BigIntegerField()
    )


# ---------------------------------------------------------------------------
# Pagination without COUNT(*) over the table
# ---------------------------------------------------------------------------


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    """Counts at most ``COUNT_CAP + 1`` rows: ``SELECT count(*) FROM (... LIMIT n)``.

    The page query itself is ``ORDER BY id DESC LIMIT/OFFSET`` on an index, so the
    list costs the same on a thousand or a hundred million rows. ``capped`` tells
    the template to say "more than 10,000".
    """

    @cached_property
    def _bounded_count(self) -> int:
        # The stubs' object_list is any sliceable sequence; ours is always a QuerySet.
        return int(self.object_list[: COUNT_CAP + 1].count())  # type: ignore[attr-defined]

    @cached_property
    def count(self) -> int:
        return min(self._bounded_count, COUNT_CAP)

    @property
    def capped(self) -> bool:
        return self._bounded_count > COUNT_CAP


# ---------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------


class AttentionFilter(admin.SimpleListFilter):
    """The three views an on-call engineer starts from."""

    title = "needs attention"
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("stuck", "Stuck (running, heartbeat stale)"),
            ("dead", "Dead-lettered"),
            ("due", "Due (pending, run_at passed)"),
            ("unknown", "Waiting: task unknown to every live worker"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job] | None:
        value = self.value()
        jobs = queryset
        if not isinstance(jobs, JobQuerySet):  # Job.objects' queryset: one home for these rules
            raise TypeError(f"expected Job.objects' JobQuerySet, got {type(jobs).__name__}")
        if value == "stuck":
            return jobs.stuck()
        if value == "dead":
            return jobs.dead()
        if value == "due":
            return jobs.due()
        if value == "unknown":  # deploy skew (skew.py): no live worker claims these
            from django_pgjobs.worker.skew import live_tasks

            known = live_tasks(connections[_alias()], stale_after=get_settings().STALE_AFTER)
            return jobs.pending().exclude(task__in=sorted(known))
        return queryset


class _ExactValueFilter(admin.SimpleListFilter):
    """A filter on one column whose choices come from a cheap source, not the table."""

    field: str = ""

    def choices_from(self, request: HttpRequest) -> Iterable[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = set(self.choices_from(request))
        current = self.value()
        if current:
            values.add(current)  # a value typed into the URL stays selectable
        return [(v, v) for v in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job] | None:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class QueueFilter(_ExactValueFilter):
    """Queues of registered jobs plus queues with pending or running rows (indexed)."""

    title = "queue"
    parameter_name = "queue"
    field = "queue"

    def choices_from(self, request: HttpRequest) -> Iterable[str]:
        from_registry = {d.queue for d in registry.all_definitions()}
        return from_registry | set(overview_queries.active_queues(connections[_alias()]))


class TaskFilter(_ExactValueFilter):
    """Task names from the registry (no query at all)."""

    title = "task"
    parameter_name = "task"
    field = "task"

    def choices_from(self, request: HttpRequest) -> Iterable[str]:
        return {d.name for d in registry.all_definitions()}


# ---------------------------------------------------------------------------
# Job admin
# ---------------------------------------------------------------------------


def _is_stuck(job: Job, now: datetime | None = None) -> bool:
    if job.status != JobStatus.RUNNING or job.heartbeat_at is None:
        return False
    age = _age(job.heartbeat_at, now)
    return age is not None and age.total_seconds() > get_settings().STALE_AFTER


class JobChangeList(ChangeList):
    """The job list loads no argument, error or result column: only the head of
    ``last_error`` (for its first line), so a page costs the same whatever the
    jobs carry (3 jobs of 50 MB arguments used to take 400 MB to list)."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Job]:
        queryset: QuerySet[Job] = super().get_queryset(request, exclude_parameters)
        return queryset.defer(*LIST_DEFERRED).annotate(
            last_error_head=Left("last_error", LIST_ERROR_CHARS)
        )


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    list_display = (
        "id",
        "task",
        "queue",
        "status_badge",
        "attempts_display",
        "run_at_short",
        "heartbeat_age",
        "worker",
        "last_error_line",
    )
    list_display_links = ("id",)
    list_filter = (AttentionFilter, "status", QueueFilter, TaskFilter)
    search_fields = ("id", "task", "idempotency_key")
    search_help_text = "A job id, an exact task name, or an exact idempotency key."
    sortable_by = ()
    ordering = ("-id",)
    list_per_page = 100
    list_max_show_all = 500
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedCountPaginator
    actions = ("retry_now", "cancel_jobs")
    change_list_template = "admin/django_pgjobs/job/change_list.html"
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
        ("Arguments", {"fields": ("args_pretty", "kwargs_pretty")}),
        ("Result", {"fields": ("result_pretty",)}),
        ("Errors", {"fields": ("last_error_full", "error_history")}),
        (
            "Lease and worker",
            {"fields": ("attempts_display", "lease", "worker", "heartbeat_at", "heartbeat_age")},
        ),
        (
            "Timings",
            {"fields": ("created_at", "run_at", "started_at", "finished_at", "waited", "ran_for")},
        ),
    )
    readonly_fields = (
        "id",
        "task",
        "queue",
        "priority",
        "status_badge",
        "idempotency_key",
        "args_pretty",
        "kwargs_pretty",
        "result_pretty",
        "last_error_full",
        "error_history",
        "attempts_display",
        "lease",
        "worker",
        "heartbeat_at",
        "heartbeat_age",
        "created_at",
        "run_at",
        "started_at",
        "finished_at",
        "waited",
        "ran_for",
        "concurrency_key",
        "concurrency_limit",
        "unique_key",
    )

    # -- permissions: view, and run actions with "change"; never add/edit/delete by hand

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # "change" on the model (obj=None) gates the actions; a job's fields are
        # never editable, so the detail page is always the read-only view.
        return obj is None and super().has_change_permission(request)

    # "delete_selected" needs the delete permission, which nobody has here.

    # -- search: indexed lookups only

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """A number finds the job by id; anything else an idempotency key or a task, exactly.

        Never ``task = x OR key = x``: ``task`` has no index, so the OR would scan the
        table. The key is probed first on its unique index; only when no job has
        that key is the term taken as a task name (read newest first by id).
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        number = term.lstrip("#")
        # isascii: "²".isdigit() is True but int("²") raises; < 19 digits fits a bigint.
        if number.isascii() and number.isdigit() and len(number) < 19:
            return queryset.filter(Q(id=int(number)) | Q(idempotency_key=term)), False
        if Job.objects.using(queryset.db).filter(idempotency_key=term).exists():
            return queryset.filter(idempotency_key=term), False
        return queryset.filter(task=term), False

    # -- list columns

    @admin.display(description="status")
    def status_badge(self, obj: Job) -> str:
        stuck = _is_stuck(obj)
        css = "stuck" if stuck else obj.status
        label = "running · stuck" if stuck else obj.status
        return format_html('<span class="pgjobs-status pgjobs-{}">{}</span>', css, label)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description="run at")
    def run_at_short(self, obj: Job) -> str:
        local = timezone.localtime(obj.run_at)
        return local.strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="heartbeat age")
    def heartbeat_age(self, obj: Job) -> str:
        if obj.status != JobStatus.RUNNING:
            return "—"
        text = format_age(_age(obj.heartbeat_at))
        if _is_stuck(obj):
            return format_html('<span class="pgjobs-stale">{}</span>', text)
        return text

    @admin.display(description="last error")
    def last_error_line(self, obj: Job) -> str:
        # The list loads only the head of last_error (JobChangeList); never the column.
        text: str | None = getattr(obj, "last_error_head", None)
        if text is None and "last_error" not in obj.get_deferred_fields():
            text = obj.last_error
        if not text or not text.strip():
            return ""
        first = text.strip().splitlines()[0]
        return first[:160] + ("…" if len(first) > 160 else "")

    # -- detail fields

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Job | None:
        """The job for the detail page, without its big columns: arguments, result
        and errors come as bounded heads computed by the database (see _json_head)."""
        if from_field is not None:
            return super().get_object(request, object_id, from_field)
        try:
            pk = Job._meta.pk.to_python(object_id)
        except (ValidationError, ValueError):
            return None
        if not isinstance(pk, int) or not 0 < pk <= MAX_ID:
            return None
        args_head, args_bytes = _json_head("args")
        kwargs_head, kwargs_bytes = _json_head("kwargs")
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
                errors_total=RawSQL(
                    "jsonb_array_length(CASE WHEN jsonb_typeof(errors) = 'array' "
                    "THEN errors ELSE '[]'::jsonb END)",
                    [],
                    output_field=BigIntegerField(),
                ),
                errors_newest=RawSQL(
                    "jsonb_path_query_array(errors, 'lax $[last - $n + 1 to last]', "
                    "jsonb_build_object('n', %s::int))",
                    [keep],
                    output_field=JSONField(),
                ),
            )
            .filter(pk=pk)
            .first()
        )
        return job

    @admin.display(description="args")
    def args_pretty(self, obj: Job) -> str:
        if hasattr(obj, "args_head"):
            return _pretty_text(obj.args_head, getattr(obj, "args_bytes", None))
        return _pretty(obj.args)

    @admin.display(description="kwargs")
    def kwargs_pretty(self, obj: Job) -> str:
        if hasattr(obj, "kwargs_head"):
            return _pretty_text(obj.kwargs_head, getattr(obj, "kwargs_bytes", None))
        return _pretty(obj.kwargs)

    @admin.display(description="result")
    def result_pretty(self, obj: Job) -> str:
        head, size = _json_head("value")
        row = (
            JobResult.objects.using(_alias())
            .filter(job_id=obj.id)
            .annotate(head=head, size=size)
            .values_list("head", "size")
            .first()
        )
        if row is None:
            return "no stored result" if obj.status == JobStatus.COMPLETED else "—"
        return _pretty_text(*row)

    @admin.display(description="last error")
    def last_error_full(self, obj: Job) -> str:
        text = getattr(obj, "last_error_head", None)
        if text is None and "last_error" not in obj.get_deferred_fields():
            text = obj.last_error
        return format_html("<pre>{}</pre>", _cut(text)) if text else "—"

    @admin.display(description="error history")
    def error_history(self, obj: Job) -> str:
        if hasattr(obj, "errors_newest"):
            errors, total = obj.errors_newest, getattr(obj, "errors_total", 0)
        else:
            errors = obj.errors if isinstance(obj.errors, list) else []
            total = len(errors)
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
                        _cut(e.get("attempt", "?")),
                        _cut(e.get("at", "?")),
                        _cut(e.get("worker") or "?"),
                        _cut(e.get("type", "Error")),
                        _cut(e.get("message", "")),
                        _cut(
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

    # -- actions: lease-fenced statements of sql.py, never obj.save()

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        """Drop ticked values that cannot be job ids ("²", above 2**63) before Django
        filters on them (which would answer HTTP 500)."""
        raw = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        valid = [v for v in raw if _is_job_id(v)]
        if valid != raw:
            post = request.POST.copy()
            post.setlist(helpers.ACTION_CHECKBOX_NAME, valid)
            request.POST = post  # type: ignore[assignment]  # the stubs: an immutable QueryDict
        return super().response_action(request, queryset, *args, **kwargs)

    def _selected_ids(self, request: HttpRequest, queryset: QuerySet[Job]) -> list[int]:
        """The ids the operator ticked (or all matching rows, newest first, up to a limit).

        Ticked ids are taken from the form, not from the filtered queryset: a job
        that left the filter since the page was drawn must be reported as skipped,
        not silently dropped. The statement re-checks every row's state anyway.
        """
        if request.POST.get("select_across") not in ("1", "on", "true", "True"):
            raw = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            ticked = sorted({int(v) for v in raw if _is_job_id(v)}, reverse=True)
            return ticked[:ACTION_LIMIT]
        ids = list(queryset.order_by("-id").values_list("id", flat=True)[: ACTION_LIMIT + 1])
        if len(ids) > ACTION_LIMIT:
            self.message_user(
                request,
                f"Only the newest {ACTION_LIMIT:,} matching jobs were "
                "processed; run the action again for the rest.",
                messages.WARNING,
            )
            ids = ids[:ACTION_LIMIT]
        return ids

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[Job],
        verb: str,
        statement: Callable[[Any, list[int]], set[int]],
        held: dict[int, int] | None = None,
    ) -> None:
        """Run ``statement`` over the selection in chunks and say what it did. ``held``
        (filled by the statement) names jobs skipped because their unique_while key is
        held by another job; every other skipped job had moved on."""
        ids = self._selected_ids(request, queryset)
        connection = connections[queryset.db]
        changed: set[int] = set()
        held = {} if held is None else held
        for start in range(0, len(ids), ACTION_CHUNK):
            changed |= statement(connection, ids[start : start + ACTION_CHUNK])
        skipped = [i for i in ids if i not in changed and i not in held]
        text = f"{verb} {len(changed)} job{'s' if len(changed) != 1 else ''}"
        if held:
            detail = ", ".join(
                f"#{i} (held by #{held[i]})" for i in sorted(held, reverse=True)[:20]
            )
            more = f" and {len(held) - 20} more" if len(held) > 20 else ""
            text += (
                f"; skipped {len(held)} whose unique key is held by another pending or "
                f"running job ({detail}{more})"
            )
        if skipped:
            moved = (
                Job.objects.using(queryset.db)
                .filter(id__in=skipped[:20])
                .values_list("id", "status")
            )
            detail = ", ".join(f"#{i} is {s}" for i, s in sorted(moved, reverse=True))
            more = f" and {len(skipped) - 20} more" if len(skipped) > 20 else ""
            text += f"; skipped {len(skipped)} whose state had moved on ({detail}{more})"
        level = messages.SUCCESS if changed and not skipped and not held else messages.WARNING
        self.message_user(request, text + ".", level)

    @admin.action(
        description="Retry now (dead, cancelled or stuck → pending)", permissions=["change"]
    )
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        stale_after = get_settings().STALE_AFTER
        held: dict[int, int] = {}

        def statement(connection: Any, ids: list[int]) -> set[int]:
            result = sql.retry_jobs(connection, ids, stale_after=stale_after)
            held.update(result.held)
            return result.changed

        self._apply(request, queryset, "Retried", statement, held)

    @admin.action(description="Cancel (pending or running → cancelled)", permissions=["change"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._apply(request, queryset, "Cancelled", sql.cancel)

    # -- extra pages: overview, reap

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "overview/",
                self.admin_site.admin_view(self.overview_view),
                name="{}_{}_overview".format(*info),
            ),
            path(
                "reap/", self.admin_site.admin_view(self.reap_view), name="{}_{}_reap".format(*info)
            ),
            *super().get_urls(),
        ]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        """Counts per queue and status, lag, stuck, throughput, workers, table health."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        conf = get_settings()
        data = overview_queries.overview(connections[_alias()], stale_after=conf.STALE_AFTER)
        finished = overview_queries.FINISHED_STATUSES
        context = {
            **self.admin_site.each_context(request),
            "title": "Job queue overview",
            "opts": self.opts,
            "ov": data,
            "finished_statuses": [s.value for s in finished],
            "queue_rows": [
                {
                    "q": q,
                    "lag": format_age(q.lag) if q.due else "—",
                    "finished": [q.finished.get(s, 0) for s in finished],
                }
                for q in data.queues
            ],
            "workers": [
                {
                    "w": w,
                    "age": format_age(w.last_seen_age),
                    "live": w.is_live(conf.STALE_AFTER),
                    "up": format_age(data.now - w.started_at),
                }
                for w in data.workers
            ],
            "health": data.health,
            "last_autovacuum_age": format_age(_age(data.health.last_autovacuum, data.now)),
            "dead_ratio_pct": round(data.health.dead_ratio * 100, 1),
            "status_estimates": sorted(data.health.status_estimates.items()),
            "stale_after": conf.STALE_AFTER,
            "window_minutes": int(overview_queries.RECENT_WINDOW.total_seconds() // 60),
            "per_second_5m": round(data.completed_5m / 300, 2),
            "per_second_60m": round(data.completed_60m / 3600, 2),
            "can_change": self.has_change_permission(request),
            # Charts of the last hour and the in-place refresh (charts.py, activity.py).
            **charts.overview_charts(connections[_alias()], data),
            "refresh_seconds": charts.refresh_seconds(request.GET.get("refresh")),
        }
        template = (
            "admin/django_pgjobs/job/_overview_live.html"
            if request.GET.get("fragment") == "live"
            else "admin/django_pgjobs/job/overview.html"
        )
        return TemplateResponse(request, template, context)

    def reap_view(self, request: HttpRequest) -> HttpResponse:
        """POST: reclaim every stuck job now (the reaper's fenced statement)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        conf = get_settings()
        before = Job.objects.db_manager(_alias()).stuck(conf.STALE_AFTER).count()  # running index
        counts = Reaper(alias=_alias(), stale_after=conf.STALE_AFTER).run_once()
        reaped = counts["reaped"]
        text = (
            f"Reaped {reaped} stuck job{'s' if reaped != 1 else ''}: "
            f"{counts.get(JobStatus.PENDING, 0)} back to pending, "
            f"{counts.get(JobStatus.DEAD, 0)} dead-lettered (no attempts left)"
        )
        skipped = max(before - reaped, 0)
        if skipped:
            text += f"; skipped {skipped} that finished, heartbeated or were taken meanwhile"
        self.message_user(request, text + ".", messages.SUCCESS if reaped else messages.INFO)
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
            target = reverse("admin:django_pgjobs_job_changelist")
        return HttpResponseRedirect(target)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {
            "table_estimate": overview_queries.estimated_rows(connections[_alias()]),
            "can_change": self.has_change_permission(request),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)


# ---------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    """Live ``runjobs`` processes; rows are written by the workers themselves."""

    list_display = (
        "id",
        "host",
        "pid",
        "queues_display",
        "concurrency",
        "started_at",
        "last_seen",
        "last_seen_age",
        "live",
    )
    readonly_fields = (
        "id",
        "host",
        "pid",
        "queues",
        "concurrency",
        "started_at",
        "last_seen",
        "tasks",
    )
    show_facets = admin.ShowFacets.NEVER

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="queues")
    def queues_display(self, obj: Worker) -> str:
        return ", ".join(obj.queues)  # a worker of every queue registers ["*"]

    @admin.display(description="last seen")
    def last_seen_age(self, obj: Worker) -> str:
        return format_age(_age(obj.last_seen)) + " ago"

    @admin.display(description="live", boolean=True)
    def live(self, obj: Worker) -> bool:
        age = _age(obj.last_seen)
        return age is not None and age.total_seconds() <= get_settings().STALE_AFTER


from django_pgjobs.admin import queues as admin_queues  # noqa: E402,F401  (QueueAdmin: pause/resume, limits)
