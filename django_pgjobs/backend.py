"""``TASKS = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend"}}``.

The ``django.tasks`` backend needs Django >= 6.0, where ``django.tasks`` exists.
This module imports on any supported Django; on Django 5.2 asking it for
``PgJobsBackend`` raises an ``ImportError`` that says so (use ``@job`` there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import django

#: Whether this Django has ``django.tasks`` (added in Django 6.0).
TASKS_AVAILABLE: bool = django.VERSION >= (6, 0)

REQUIREMENT = (
    "django_pgjobs.backend.PgJobsBackend needs Django >= 6.0, which added django.tasks; "
    f"this is Django {django.get_version()}. On Django 5.2 define jobs with "
    "django_pgjobs.job (@job) instead, or upgrade Django."
)

__all__ = ["REQUIREMENT", "TASKS_AVAILABLE", "PgJobsBackend", "PgJobsTask"]

if TYPE_CHECKING or TASKS_AVAILABLE:
    from django_pgjobs.tasks.bridge import PgJobsTask
    from django_pgjobs.tasks.django_backend import PgJobsBackend
else:

    def __getattr__(name: str) -> Any:
        if name in ("PgJobsBackend", "PgJobsTask"):
            raise ImportError(REQUIREMENT)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def autodiscover_tasks() -> None:
    """Import every installed app's ``tasks`` module when a TASKS backend is ours.

    Called from ``AppConfig.ready``: a worker runs only tasks registered in its own
    process, and Django projects keep their tasks in ``tasks.py`` (``jobs.py`` is
    always imported). Does nothing on Django 5.2 or without a PgJobsBackend.
    """
    if not TASKS_AVAILABLE:
        return
    from django.conf import settings
    from django.utils.module_loading import autodiscover_modules, import_string

    configured = getattr(settings, "TASKS", None) or {}
    for params in configured.values() if isinstance(configured, dict) else ():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django's own check reports a bad BACKEND
        if isinstance(backend, type) and issubclass(backend, PgJobsBackend):
            autodiscover_modules("tasks")
            return
