"""The job admin: find stuck and dead-lettered jobs, retry or cancel them, read the overview.

``JobAdmin`` is made of one part per duty, each in its module: the list
(``job_list.py``: bounded counts, indexed filters and search), the detail page
(``job_detail.py``: read-only, big values cut by the database), the actions
(``job_actions.py``: retry, cancel and reap through the fenced operations) and the
overview page (``overview_page.py``). Rules every part keeps:

* **No hand edits.** Jobs cannot be added, edited or deleted here; the detail page
  is read-only. Every state change goes through the lease-fenced statements of
  ``db/`` (the ones the worker and reaper use) — never ``obj.save()`` — so an
  admin retry or cancel fences a worker still running the job.
* **Quick on millions of rows.** No full count, no ``SELECT DISTINCT`` over the
  history, only indexed filters (see ``job_list.py``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import URLPattern, path

from django_pgjobs.admin.job_actions import JobActions
from django_pgjobs.admin.job_detail import JobDetail
from django_pgjobs.admin.job_list import JobList
from django_pgjobs.admin.overview_page import OverviewPage
from django_pgjobs.models import Job


@admin.register(Job)
class JobAdmin(JobList, JobDetail, JobActions, OverviewPage):
    """View with the "view" permission; run the actions with "change"; never add,
    edit or delete by hand ("delete_selected" needs the delete permission, which
    nobody has here)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # "change" on the model (obj=None) gates the actions; a job's fields are
        # never editable, so the detail page is always the read-only view.
        return obj is None and super().has_change_permission(request)

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
