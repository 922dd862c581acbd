"""The job list: bounded counts, indexed filters, columns that load no big value.

* **No full counts.** The list counts at most ``COUNT_CAP`` matching rows (and
  shows PostgreSQL's row estimate for the whole table), facets are off, and the
  queue/task filter choices come from the registry plus a loose index scan of the
  pending rows, never from ``SELECT DISTINCT`` over the history.
* **Indexed filters.** Status filters use ``(status, -id)``, "stuck" the partial
  running index, "due" the partial claim index; ordering is always ``-id``; search
  is by id, exact idempotency key or exact task (one the registry or a worker knows:
  a name no job can carry scans nothing).
* **A window for the columns without an index.** ``task`` and ``queue`` have no index
  over finished rows (one more would cost every claim and completion), so a task or
  queue filter or a task search looks through the newest ``SEARCH_WINDOW`` jobs of
  the list the other filters leave (all of them when the list is shorter), never the
  whole history: a task with no rows among 1,000,000 cost a scan of the table (300-700
  ms). The page says where it stopped and links to the next older window (``id__lt``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, Q, QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from django_pgjobs.admin.lookups import refuse_nul
from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import live_tasks
from django_pgjobs.health import overview as overview_queries
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.managers import JobQuerySet
from django_pgjobs.models import Job, KnownTask
from django_pgjobs.states import JobStatus
from django_pgjobs.support.ages import age_since, format_age

#: The list counts at most this many matching rows ("more than 10,000 jobs").
COUNT_CAP = 10_000
#: Characters of ``last_error`` loaded for the list (its first line is shown).
LIST_ERROR_CHARS = 400
#: Columns the list never loads: a page of 100 rows must not read 100 argument sets.
LIST_DEFERRED = ("args", "kwargs", "errors", "last_error")
#: Largest job id (bigint): a ticked or searched number above it matches nothing.
MAX_ID = 2**63 - 1
#: A task or queue filter, or a task search, looks through at most this many of the
#: newest jobs of the list (``task`` and ``queue`` have no index over finished rows).
SEARCH_WINDOW = 100_000
#: Stands for a job id in the change page's URL, reversed once per page.
PK_MARK = "pgjobsid"
#: Where ``get_search_results`` leaves the window's first id for the page (request attribute).
WINDOW_FLOOR = "_pgjobs_window_floor"


def is_job_id(text: str) -> bool:
    """ASCII digits of a bigint ("²".isdigit() is True, but int("²") raises)."""
    return text.isascii() and text.isdigit() and len(text) <= 19 and 0 < int(text) <= MAX_ID


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    """Counts at most ``COUNT_CAP + 1`` rows: ``SELECT count(*) FROM (... LIMIT n)``.

    The page query itself is ``ORDER BY id DESC LIMIT/OFFSET`` on an index, so the
    list costs the same on a thousand or a hundred million rows. ``capped`` tells
    the template to say "more than 10,000".
    """

    @cached_property
    def _bounded_count(self) -> int:
        # Any COUNT_CAP + 1 matching rows will do: without ORDER BY the planner stops at
        # the first ones its index finds, instead of sorting every match by id first
        # (all 100,000 due jobs, for "due"). The stubs' object_list is any sliceable
        # sequence; ours is always a QuerySet.
        # Only the id is selected: the list's columns (the head of last_error) are not
        # computed for the rows counted.
        counted = self.object_list.order_by().values("pk")  # type: ignore[attr-defined]
        return int(counted[: COUNT_CAP + 1].count())

    @cached_property
    def count(self) -> int:
        return min(self._bounded_count, COUNT_CAP)

    @property
    def capped(self) -> bool:
        return self._bounded_count > COUNT_CAP


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
        if value == "unknown":  # deploy skew (db/workers.py): no live worker claims these
            conf = get_settings()
            known = live_tasks(connections[conf.DATABASE], stale_after=conf.STALE_AFTER)
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
        # Applied by JobList.get_search_results, after every other filter, inside the
        # window of the newest jobs (module docstring): the column has no index.
        return queryset


class QueueFilter(_ExactValueFilter):
    """Queues of registered jobs plus queues with pending or running rows (indexed)."""

    title = "queue"
    parameter_name = "queue"
    field = "queue"

    def choices_from(self, request: HttpRequest) -> Iterable[str]:
        from_registry = {d.queue for d in registry.all_definitions()}
        active = overview_queries.active_queues(connections[get_settings().DATABASE])
        return from_registry | set(active)


class TaskFilter(_ExactValueFilter):
    """Task names from the registry (no query at all)."""

    title = "task"
    parameter_name = "task"
    field = "task"

    def choices_from(self, request: HttpRequest) -> Iterable[str]:
        return {d.name for d in registry.all_definitions()}


class FairKeyFilter(_ExactValueFilter):
    """Fair keys of pending jobs (the fair index, a few hundred at most)."""

    title = "fair key"
    parameter_name = "fair_key"
    field = "fair_key"

    def choices_from(self, request: HttpRequest) -> Iterable[str]:
        # not "": the shared key of other tasks' jobs in a fair queue has no link
        keys = overview_queries.pending_fair_keys(connections[get_settings().DATABASE])
        return [k for k in keys if k]


def newest_floor(queryset: QuerySet[Job], n: int) -> int | None:
    """The id of the ``n``-th newest job of ``queryset`` (``None``: it holds fewer).

    ``ORDER BY id DESC LIMIT 1 OFFSET n - 1``: reads ``n`` entries of the index that
    serves the list (the primary key, or a status's partial index), never more."""
    ids = list(queryset.order_by("-id").values_list("id", flat=True)[n - 1 : n])
    return int(ids[0]) if ids else None


def is_stuck(job: Job, now: datetime | None = None) -> bool:
    if job.status != JobStatus.RUNNING or job.heartbeat_at is None:
        return False
    age = age_since(job.heartbeat_at, now)
    return age is not None and age.total_seconds() > get_settings().STALE_AFTER


class JobChangeList(ChangeList):
    """The job list loads no argument, error or result column: only the head of
    ``last_error`` (for its first line), so a page costs the same whatever the
    jobs carry (3 jobs of 50 MB arguments used to take 400 MB to list)."""

    #: the first id of the window a task or queue condition was looked for in, if any
    window_floor: int | None = None
    #: each row's link: the change page's URL with PK_MARK for the id (one reverse())
    _change_url: str | None = None
    #: the list's filters, carried by each row's link (see ``get_results``)
    _row_filters: str = ""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Job]:
        refuse_nul(request)  # ``?queue=%00`` was a 500 (lookups.py)
        queryset: QuerySet[Job] = super().get_queryset(request, exclude_parameters)
        self.window_floor = getattr(request, WINDOW_FLOOR, None)
        return queryset.defer(*LIST_DEFERRED).annotate(
            last_error_head=Left("last_error", LIST_ERROR_CHARS)
        )

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if self.result_count == 0:  # counted none: the page need not read the window again
            self.result_list = self.queryset.none()
        if not self.is_popup and self.preserved_filters:
            # Django's row renderer merges these into each row's link with a resolve() of
            # that link, per row (a fifth of a filtered page's time); url_for_result adds
            # the same query string once computed. Nothing else reads cl.preserved_filters.
            self._row_filters = urlencode(dict(parse_qsl(self.preserved_filters)))
            self.preserved_filters = ""

    def url_for_result(self, result: Model) -> str:
        """Django's link to a job's page, from one ``reverse()`` per page, not per row."""
        if self._change_url is None:
            self._change_url = reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_change",
                args=(PK_MARK,),
                current_app=self.model_admin.admin_site.name,
            )
        url = self._change_url.replace(PK_MARK, str(quote(result.pk)))
        return f"{url}?{self._row_filters}" if self._row_filters else url

    @property
    def window_size(self) -> str:
        return f"{SEARCH_WINDOW:,}"

    @property
    def older_window_url(self) -> str:
        """The same list, from the job before the window on (its next older window)."""
        return str(self.get_query_string({"id__lt": self.window_floor}, remove=[PAGE_VAR]))


class JobList(admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    """The list part of ``JobAdmin`` (``jobs.py``): its columns, filters and search."""

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
    list_filter = (AttentionFilter, "status", QueueFilter, TaskFilter, FairKeyFilter)
    search_fields = ("id", "task", "idempotency_key")
    search_help_text = (
        "A job id, an exact idempotency key, or the exact name of a task this site or a "
        "worker knows."
    )
    sortable_by = ()
    ordering = ("-id",)
    list_per_page = 100
    list_max_show_all = 500
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedCountPaginator
    change_list_template = "admin/django_pgjobs/job/change_list.html"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {
            "table_estimate": overview_queries.estimated_rows(connections[get_settings().DATABASE]),
            "can_change": self.has_change_permission(request),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    # -- search: indexed lookups only

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """A number finds the job by id; anything else an idempotency key or a task, exactly.

        Never ``task = x OR key = x``: ``task`` has no index, so the OR would scan the
        table. The key is probed first on its unique index; only when no job has
        that key is the term taken as a task name (read newest first by id).

        The task, queue and fair key filters' conditions are applied here as well,
        after every other filter: a task, queue or fair key condition (no column has an
        index over finished rows) is looked for in the newest ``SEARCH_WINDOW`` jobs of the list
        (module docstring); a job id or an idempotency key needs no window.
        """
        conditions = [
            Q(**{spec.field: value})
            for spec in (TaskFilter, QueueFilter, FairKeyFilter)
            if (value := request.GET.get(spec.parameter_name))
        ]
        narrowed = False  # to a job id or an idempotency key: their indexes, no window
        term = search_term.strip()
        if term:
            number = term.lstrip("#")
            # isascii: "²".isdigit() is True but int("²") raises; < 19 digits fits a bigint.
            if number.isascii() and number.isdigit() and len(number) < 19:
                queryset = queryset.filter(Q(id=int(number)) | Q(idempotency_key=term))
                narrowed = True
            elif Job.objects.using(queryset.db).filter(idempotency_key=term).exists():
                queryset = queryset.filter(idempotency_key=term)
                narrowed = True
            # A name no job can carry must not read anything (it would scan the whole table):
            # only a task the registry or a worker knows is looked for.
            elif (
                registry.find(term) is not None
                or KnownTask.objects.using(queryset.db).filter(name=term).exists()
            ):
                conditions.append(Q(task=term))
            else:
                return queryset.none(), False
        if conditions and not narrowed:
            floor = newest_floor(queryset, SEARCH_WINDOW)
            if floor is not None:  # the list is longer than the window
                setattr(request, WINDOW_FLOOR, floor)
                queryset = queryset.filter(id__gte=floor)
        for condition in conditions:
            queryset = queryset.filter(condition)
        return queryset, False

    # -- columns (also shown on the detail page)

    def action_checkbox(self, obj: Job) -> SafeString:
        """Django's checkbox, written out: rendering its form widget's templates for
        each row was a third of a 100-row page's time."""
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            ACTION_CHECKBOX_NAME,
            obj.pk,
            format_html(_("Select this object for an action - {}"), str(obj)),
        )

    @admin.display(description="status")
    def status_badge(self, obj: Job) -> str:
        stuck = is_stuck(obj)
        css = "stuck" if stuck else obj.status
        label = "running · stuck" if stuck else obj.status
        return format_html('<span class="pgjobs-status pgjobs-{}">{}</span>', css, label)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description="run at")
    def run_at_short(self, obj: Job) -> str:
        # naive under USE_TZ = False: already in TIME_ZONE, as Django stores it
        local = timezone.localtime(obj.run_at) if timezone.is_aware(obj.run_at) else obj.run_at
        return local.strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="heartbeat age")
    def heartbeat_age(self, obj: Job) -> str:
        if obj.status != JobStatus.RUNNING:
            return "—"
        text = format_age(age_since(obj.heartbeat_at))
        if is_stuck(obj):
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
