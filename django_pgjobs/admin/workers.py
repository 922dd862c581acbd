"""Admin for the live ``runjobs`` processes: read-only rows the workers write themselves."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from django_pgjobs.admin.lookups import RefusesNulLookups
from django_pgjobs.conf import get_settings
from django_pgjobs.models import Worker
from django_pgjobs.support import decoding
from django_pgjobs.support.ages import age_since, format_age


@admin.register(Worker)
class WorkerAdmin(RefusesNulLookups, admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
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
        "degraded",
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
        "degraded",
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
        # A worker of every queue registers ["*"]; a row psql wrote may hold anything.
        queues = obj.queues if isinstance(obj.queues, list) else [obj.queues]
        return ", ".join(decoding.as_text(q) for q in queues)

    @admin.display(description="last seen")
    def last_seen_age(self, obj: Worker) -> str:
        return format_age(age_since(obj.last_seen)) + " ago"

    @admin.display(description="live", boolean=True)
    def live(self, obj: Worker) -> bool:
        age = age_since(obj.last_seen)
        return age is not None and age.total_seconds() <= get_settings().STALE_AFTER
