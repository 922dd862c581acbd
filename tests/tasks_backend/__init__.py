"""Helpers of the django.tasks backend's tests (``tests/*/test_tasks_backend_*.py``): its settings,
the tasks they enqueue, and draining them (Django >= 6.0)."""
