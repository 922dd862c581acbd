"""The ``TASKS`` setting of the test project (imported by tests/settings.py on Django >= 6.0)."""

from __future__ import annotations

BACKEND = "django_pgjobs.backend.PgJobsBackend"

TASKS = {
    # Like Django's own TaskTestCase: a restricted set of queues on the default alias.
    "default": {"BACKEND": BACKEND, "QUEUES": ["default", "queue_1"]},
    # Any queue name, and a per-backend default for max_attempts.
    "retrying": {"BACKEND": BACKEND, "QUEUES": [], "OPTIONS": {"max_attempts": 3}},
    # Django's built-in backend, to check that results don't cross backends.
    "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": []},
}
