"""Admin for workflow runs (workflows, chains, groups, chords, batches): the list with
each run's progress, a run's page with its graph (``admin/workflow_graph.py``) and
its nodes, retrying a run's failed nodes (their dependents resume) and cancelling
whole runs.

Every page makes a fixed number of queries, each bounded whatever the size of the
run: the list counts at most ``PROGRESS_CAP`` nodes of each run on the page, a run's
page counts its nodes by status (one pass over its index entries), reads at most
``HEAD`` + ``TAIL`` nodes for the graph and ``NODES_SHOWN`` for the table.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs.admin.charts import legend
from django_pgjobs.admin.lookups import RefusesNulLookups
from django_pgjobs.admin.workflow_graph import (
    EDGE_LIMIT,
    HEAD,
    STATUS_COLOURS,
    TAIL,
    graph_svg,
)
from django_pgjobs.models import Workflow
from django_pgjobs.workflows.runs import (
    STATUS_ORDER,
    Progress,
    cancel_workflow,
    graph_sample,
    retry_failed,
    run_progress,
    runs_progress,
    workflow_graph,
)

#: Nodes listed on a run's page (a 10,000-member chord shows its first ones).
NODES_SHOWN = 500
#: Nodes counted per run on the list (a larger run shows "N+"; its page counts all).
PROGRESS_CAP = 10_000


def progress_bar(progress: Progress) -> SafeString:
    """``done / total`` and a bar split by status (escaped numbers and our colours)."""
    total = progress.total
    plus = "+" if progress.capped else ""
    parts = "".join(
        f'<span style="display:inline-block;height:8px;width:{100 * n / total:.2f}%;'
        f'background:{STATUS_COLOURS[s]}" title="{n} {s}"></span>'
        for s in STATUS_ORDER
        if (n := progress.counts.get(s, 0)) and total
    )
    return mark_safe(  # noqa: S308 - numbers, our status names and colours only
        f'<span class="pgjobs-progress" data-done="{progress.done}" data-total="{total}">'
        f"{progress.done}{plus} / {total}{plus} done"
        f'<span style="display:flex;width:12em;background:#eee;margin-top:2px">{parts}</span>'
        "</span>"
    )


def run_link(run_id: int | None) -> str:
    """A link to run ``run_id``'s admin page ("—" for a job outside any run)."""
    if run_id is None:
        return "—"
    url = reverse("admin:django_pgjobs_workflow_change", args=[run_id])
    return format_html('<a href="{}">run #{}</a>', url, run_id)


@admin.register(Workflow)
class WorkflowAdmin(RefusesNulLookups, admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    list_display = ("id", "name", "kind", "progress", "created_at", "cancelled_at", "batch_counts")
    list_display_links = ("id", "name")
    list_filter = ("kind",)
    search_fields = ("name",)
    show_facets = admin.ShowFacets.NEVER
    actions = ("retry_failed_runs", "cancel_runs")
    fields = (
        "id",
        "name",
        "kind",
        "created_at",
        "cancelled_at",
        "closed_at",
        "fired_at",
        "batch_counts",
        "nodes",
    )
    readonly_fields = fields

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's runs with their progress, counted in one query for the page."""
        cl = super().get_changelist_instance(request)
        runs = list(cl.result_list)  # evaluates the page once; the template reuses it
        counted = runs_progress([r.id for r in runs], cap=PROGRESS_CAP, using=cl.queryset.db)
        for run in runs:
            run.pgjobs_progress = counted[run.id]
        return cl

    @admin.display(description="progress")
    def progress(self, obj: Workflow) -> str:
        counted = getattr(obj, "pgjobs_progress", None)
        if counted is None:
            counted = run_progress(obj.id, using=obj._state.db)
        return progress_bar(counted)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The run's page: its progress and graph above the fields (three queries)."""
        context = dict(extra_context or {})
        try:
            run_id = int(object_id)
        except ValueError:
            run_id = None
        if run_id is not None:
            alias = self.get_queryset(request).db
            counted = run_progress(run_id, using=alias)
            sample = graph_sample(run_id, head=HEAD, tail=TAIL, edge_limit=EDGE_LIMIT, using=alias)
            jobs = reverse("admin:django_pgjobs_job_changelist")
            context.update(
                pgjobs_progress=progress_bar(counted),
                pgjobs_legend=legend(
                    [
                        (STATUS_COLOURS[s], s, str(counted.counts[s]))
                        for s in STATUS_ORDER
                        if s in counted.counts
                    ]
                ),
                pgjobs_graph=graph_svg(
                    run_id,
                    sample,
                    counted,
                    lambda job_id: reverse("admin:django_pgjobs_job_change", args=[job_id]),
                    f"{jobs}?workflow_id={run_id}",
                ),
                pgjobs_graph_note=self._graph_note(sample, counted),
                pgjobs_failed=counted.counts.get("dead", 0) + counted.counts.get("cancelled", 0),
                pgjobs_unfinished=counted.total - counted.done,
            )
        return super().change_view(request, object_id, form_url, context)

    @staticmethod
    def _graph_note(sample: Any, counted: Progress) -> str:
        notes = []
        if not sample.complete:
            notes.append(
                f"{counted.total} nodes: the first {HEAD} and the last {TAIL} are read; "
                "the ones between are one box"
            )
        if sample.edges_truncated:
            notes.append(f"only the first {EDGE_LIMIT} edges are drawn")
        return "; ".join(notes)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # "change" runs the actions; the page itself edits nothing (all fields read-only)
        return super().has_change_permission(request, obj)

    @admin.display(description="batch: members / completed / dead / cancelled")
    def batch_counts(self, obj: Workflow) -> str:
        if obj.kind != "batch":
            return "—"
        members = "open" if obj.members is None else str(obj.members)
        return f"{members} / {obj.completed} / {obj.dead} / {obj.cancelled}"

    @admin.display(description="nodes")
    def nodes(self, obj: Workflow) -> str:
        graph = workflow_graph(obj.id, using=obj._state.db, limit=NODES_SHOWN)
        parents: dict[int, list[int]] = {}
        for edge in graph.edges:
            parents.setdefault(edge.child, []).append(edge.parent)
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">#{}</a></td><td>{}</td><td>{}</td>'
            '<td><span class="pgjobs-status pgjobs-{}">{}</span></td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse("admin:django_pgjobs_job_change", args=[n.id]),
                    n.id,
                    n.name,
                    n.task,
                    n.status,
                    n.status,
                    ", ".join(f"#{p}" for p in parents.get(n.id, [])) or "—",
                    (n.last_error or "")[:200],
                )
                for n in graph.nodes
            ),
        )
        more = f" (the first {NODES_SHOWN})" if graph.truncated else ""
        return format_html(
            '<table class="pgjobs-grid"><caption>{} nodes{}</caption><thead><tr><th>job</th>'
            "<th>node</th><th>task</th><th>status</th><th>after</th><th>last error</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            len(graph.nodes),
            more,
            rows,
        )

    @admin.action(
        description="Retry the failed nodes of the selected runs (their dependents resume)",
        permissions=["change"],
    )
    def retry_failed_runs(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
        retried, skipped = 0, []
        for run in queryset:
            if run.cancelled_at is not None:
                skipped.append(f"#{run.id}")
                continue
            retried += retry_failed(run.id, using=queryset.db)
        self.message_user(request, f"Retried {retried} failed node(s).", messages.SUCCESS)
        if skipped:
            self.message_user(
                request,
                f"Not retried: run(s) {', '.join(skipped)} were cancelled (cancel is final "
                "for a run; retry its jobs from the job list).",
                messages.WARNING,
            )

    @admin.action(
        description="Cancel the selected runs (every job not finished → cancelled)",
        permissions=["change"],
    )
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
        changed = sum(cancel_workflow(run.id, using=queryset.db) for run in queryset)
        self.message_user(
            request, f"Cancelled {changed} job(s) of {queryset.count()} run(s).", messages.SUCCESS
        )
