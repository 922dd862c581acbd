"""Admin for queues as rows: pause/resume, ``max_running``, ``rate`` and the weights of
fair keys at runtime; a queue's page shows its busiest fair keys.

Every save and action wakes the workers (NOTIFY) so they re-read the limits at
once instead of at their next ``POLL_INTERVAL``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from django_pgjobs import queues
from django_pgjobs.admin.lookups import RefusesNulLookups
from django_pgjobs.conf import get_settings
from django_pgjobs.health import overview as overview_queries
from django_pgjobs.jobs.fair_schema import weights_problems
from django_pgjobs.models import Job, Queue
from django_pgjobs.states import JobStatus


class QueueForm(forms.ModelForm):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    class Meta:
        model = Queue
        fields = ("name", "paused", "max_running", "rate", "weights")

    def clean_rate(self) -> str | None:
        value = self.cleaned_data.get("rate") or None
        if value is not None:
            try:
                queues.parse_rate(value)
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        return value

    def clean_weights(self) -> dict[str, int] | None:
        value = self.cleaned_data.get("weights") or None
        problems = weights_problems(value)
        if problems:
            raise forms.ValidationError("; ".join(problems))
        return value


@admin.register(Queue)
class QueueAdmin(RefusesNulLookups, admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    form = QueueForm
    list_display = ("name", "paused", "max_running", "rate", "running", "pending", "updated_at")
    list_editable = ("paused", "max_running", "rate")
    actions = ("pause", "resume")
    show_facets = admin.ShowFacets.NEVER

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("name",) if obj is not None else ()

    @admin.display(description="running")
    def running(self, obj: Queue) -> int:
        return Job.objects.filter(status=JobStatus.RUNNING, queue=obj.name).count()

    @admin.display(description="pending")
    def pending(self, obj: Queue) -> int:
        return Job.objects.filter(status=JobStatus.PENDING, queue=obj.name).count()

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The queue's page: its busiest fair keys above the fields (one bounded query;
        none shown for a queue without fair keys)."""
        context = dict(extra_context or {})
        name = unquote(object_id)
        database = connections[get_settings().DATABASE]
        jobs = reverse("admin:django_pgjobs_job_changelist")
        context["pgjobs_fair_keys"] = [
            (
                key,
                pending,
                pending >= overview_queries.BUSIEST_COUNT_CAP,
                f"{jobs}?{urlencode({'queue': name, 'fair_key': key, 'status__exact': 'pending'})}",
            )
            for key, pending in overview_queries.busiest_fair_keys(database, name)
        ]
        context["pgjobs_fair_keys_read"] = overview_queries.BUSIEST_KEYS_READ
        return super().change_view(request, object_id, form_url, context)

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        queues.notify_changed(get_settings().DATABASE)

    def delete_model(self, request: HttpRequest, obj: Queue) -> None:
        super().delete_model(request, obj)
        queues.notify_changed(get_settings().DATABASE)

    @admin.action(
        description="Pause selected queues (workers stop claiming; running jobs finish)",
        permissions=["change"],
    )
    def pause(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        names = queues.pause_queue(*queryset.values_list("name", flat=True))
        self.message_user(
            request, f"Paused {len(names)} queue(s): {', '.join(names)}.", messages.SUCCESS
        )

    @admin.action(description="Resume selected queues", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        names = queues.resume_queue(*queryset.values_list("name", flat=True))
        self.message_user(
            request, f"Resumed {len(names)} queue(s): {', '.join(names)}.", messages.SUCCESS
        )
