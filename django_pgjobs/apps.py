"""App config: import every installed app's ``jobs`` module and
``PGJOBS["JOB_MODULES"]`` at startup; sync ``PGJOBS["QUEUES"]`` after ``migrate``."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgJobsConfig(AppConfig):
    name = "django_pgjobs"
    label = "django_pgjobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_pgjobs import checks  # noqa: F401  (registers the system checks)
        from django_pgjobs.support import safetext

        safetext.install()  # names from rows never split log lines or reach terminals raw

        autodiscover_modules("jobs")
        from django_pgjobs.conf import SettingsError, get_settings
        from django_pgjobs.jobs.registry import import_job_modules

        try:
            modules = get_settings().JOB_MODULES
        except SettingsError:
            modules = []  # a bad PGJOBS is reported by the system check, not a crash here
        import_job_modules(modules)
        from django.db.models.signals import post_migrate

        from django_pgjobs.queues import sync_after_migrate

        post_migrate.connect(sync_after_migrate, sender=self)
        from django_pgjobs.backend import autodiscover_tasks

        autodiscover_tasks()  # django.tasks modules, when TASKS uses PgJobsBackend
