"""The admin's overview page: counts per queue and status, lag, stuck jobs, throughput,
workers, table health and the last hour's charts, refreshed in place.

Its numbers come from ``health/overview.py`` (the queries ``jobs_status`` shares) and
``charts.py``; this module only lays them out for the template.
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from django_pgjobs.admin import charts
from django_pgjobs.conf import get_settings
from django_pgjobs.health import overview as overview_queries
from django_pgjobs.support.ages import age_since, format_age


class OverviewPage(admin.ModelAdmin):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    """The overview part of ``JobAdmin`` (``jobs.py``), shown with the view permission."""

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        """Counts per queue and status, lag, stuck, throughput, workers, table health."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        conf = get_settings()
        connection = connections[conf.DATABASE]
        data = overview_queries.overview(connection, stale_after=conf.STALE_AFTER)
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
            "last_autovacuum_age": format_age(age_since(data.health.last_autovacuum, data.now)),
            "dead_ratio_pct": round(data.health.dead_ratio * 100, 1),
            "status_estimates": sorted(data.health.status_estimates.items()),
            "stale_after": conf.STALE_AFTER,
            "window_minutes": int(overview_queries.RECENT_WINDOW.total_seconds() // 60),
            "per_second_5m": round(data.rate_5m, 2),
            "per_second_60m": round(data.rate_60m, 2),
            "can_change": self.has_change_permission(request),
            # Charts of the last hour and the in-place refresh (charts.py, activity.py).
            **charts.overview_charts(connection, data),
            "refresh_seconds": charts.refresh_seconds(request.GET.get("refresh")),
        }
        template = (
            "admin/django_pgjobs/job/_overview_live.html"
            if request.GET.get("fragment") == "live"
            else "admin/django_pgjobs/job/overview.html"
        )
        return TemplateResponse(request, template, context)
