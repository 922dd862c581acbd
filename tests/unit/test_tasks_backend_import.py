"""The backend module imports on every supported Django, and says what it needs."""

from __future__ import annotations

import importlib

import django
import pytest


def test_module_imports_and_explains_requirement() -> None:
    backend = importlib.import_module("django_pgjobs.backend")
    assert backend.TASKS_AVAILABLE is (django.VERSION >= (6, 0))
    assert "Django >= 6.0" in backend.REQUIREMENT
    if backend.TASKS_AVAILABLE:
        cls = backend.PgJobsBackend
        assert (
            cls.supports_defer,
            cls.supports_priority,
            cls.supports_get_result,
            cls.supports_async_task,
        ) == (True, True, True, True)
    else:
        with pytest.raises(ImportError, match=r"needs Django >= 6\.0"):
            from django_pgjobs.backend import PgJobsBackend  # noqa: F401
        backend.autodiscover_tasks()  # a no-op on Django 5.2
