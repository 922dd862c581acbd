"""App config: autodiscover every installed app's ``jobs`` module at startup."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgJobsConfig(AppConfig):
    name = "django_pgjobs"
    label = "django_pgjobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            safetext,
        )

        safetext.install()  # names from rows never split log lines or reach terminals raw

        autodiscover_modules("jobs")
        from .backend import autodiscover_tasks

        autodiscover_tasks()  # django.tasks modules, when TASKS uses PgJobsBackend
