"""Is django-pgjobs in ``INSTALLED_APPS``? Asked wherever a user first meets the package
(its models, ``@job``), so a missing entry fails with the fix instead of Django's
generic model error, an "Unknown command", or jobs that no worker ever sees."""

from __future__ import annotations

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

NOT_INSTALLED = (
    "django-pgjobs is not installed in this project: add 'django_pgjobs' to "
    "INSTALLED_APPS in your settings, then run `python manage.py migrate`"
)


def require_installed(what: str) -> None:
    """Raise ``ImproperlyConfigured`` naming the fix when ``django_pgjobs`` is missing
    from ``INSTALLED_APPS``. Silent before the app registry is populated, when nothing
    can be known yet."""
    if apps.apps_ready and not apps.is_installed("django_pgjobs"):
        raise ImproperlyConfigured(f"{what}: {NOT_INSTALLED}")
