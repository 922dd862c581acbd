"""The job list's actions (Retry, Cancel, Wake now; Send a signal is
``signal_action.py``) and the Reap button: state changes only
through the lease-fenced operations, never ``obj.save()``.

Retry and cancel are ``operations.retry`` / ``operations.cancel`` (the same as
``Job.objects.filter(...).retry()`` and the commands), so an admin retry or cancel
fences a worker still running the job; this module picks the ids and says what
happened, naming the jobs that were skipped and why.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from django_pgjobs.admin.job_list import is_job_id
from django_pgjobs.admin.signal_action import send_signal_action
from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import job_wake_now
from django_pgjobs.jobs import operations
from django_pgjobs.maintenance.reaper import Reaper
from django_pgjobs.models import Job
from django_pgjobs.states import JobStatus

#: An action on "all matching jobs" touches at most this many rows per click.
ACTION_LIMIT = 10_000
#: Skipped jobs named in a message before "and N more".
NAMED = 20


class JobActions(admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    """The actions part of ``JobAdmin`` (``jobs.py``); each needs the "change" permission."""

    actions = ("retry_now", "cancel_jobs", "wake_now", send_signal_action)

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        """Drop ticked values that cannot be job ids ("²", above 2**63) before Django
        filters on them (which would answer HTTP 500)."""
        raw = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        valid = [v for v in raw if is_job_id(v)]
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
            ticked = sorted({int(v) for v in raw if is_job_id(v)}, reverse=True)
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

    def _report(
        self,
        request: HttpRequest,
        verb: str,
        ids: list[int],
        changed: set[int],
        held: dict[int, int],
        using: str,
    ) -> None:
        """Say what the action did. ``held``: jobs skipped because their unique_while
        key is held by another job; every other skipped job had moved on."""
        skipped = [i for i in ids if i not in changed and i not in held]
        text = f"{verb} {len(changed)} job{'s' if len(changed) != 1 else ''}"
        if held:
            detail = ", ".join(
                f"#{i} (held by #{held[i]})" for i in sorted(held, reverse=True)[:NAMED]
            )
            more = f" and {len(held) - NAMED} more" if len(held) > NAMED else ""
            text += (
                f"; skipped {len(held)} whose unique key is held by another pending or "
                f"running job ({detail}{more})"
            )
        if skipped:
            moved = (
                Job.objects.using(using).filter(id__in=skipped[:NAMED]).values_list("id", "status")
            )
            detail = ", ".join(f"#{i} is {s}" for i, s in sorted(moved, reverse=True))
            more = f" and {len(skipped) - NAMED} more" if len(skipped) > NAMED else ""
            text += f"; skipped {len(skipped)} whose state had moved on ({detail}{more})"
        level = messages.SUCCESS if changed and not skipped and not held else messages.WARNING
        self.message_user(request, text + ".", level)

    @admin.action(
        description="Retry now (dead, cancelled or stuck → pending)", permissions=["change"]
    )
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        ids = self._selected_ids(request, queryset)
        result = operations.retry(ids, using=queryset.db)
        self._report(request, "Retried", ids, result.changed, result.held, queryset.db)

    @admin.action(
        description="Cancel (blocked, waiting, pending or running → cancelled)",
        permissions=["change"],
    )
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        ids = self._selected_ids(request, queryset)
        changed = operations.cancel(ids, using=queryset.db)
        self._report(request, "Cancelled", ids, changed, {}, queryset.db)

    @admin.action(
        description="Wake now (waiting → pending: a sleep ends now, a wait looks again)",
        permissions=["change"],
    )
    def wake_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        ids = self._selected_ids(request, queryset)
        changed = job_wake_now(connections[queryset.db], ids)
        self._report(request, "Woke", ids, changed, {}, queryset.db)

    def reap_view(self, request: HttpRequest) -> HttpResponse:
        """POST: reclaim every stuck job now (the reaper's fenced statement)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        conf = get_settings()
        before = Job.objects.db_manager(conf.DATABASE).stuck(conf.STALE_AFTER).count()
        counts = Reaper(alias=conf.DATABASE, stale_after=conf.STALE_AFTER).run_once()
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
