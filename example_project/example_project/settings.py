"""Settings for the example shop.

The database is ``DATABASE_URL`` (read with django-environ), e.g.
``postgres://postgres@127.0.0.1:5432/shop``. When it is unset, an embedded
PostgreSQL (pgserver) is started — or reused — with its data in
``example_project/.pgdata/``, so the demo needs nothing installed but Python.
Every process (runserver, runjobs, demo) finds the same embedded server.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent  # example_project/

env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="django-pgjobs-example-shop-not-a-secret")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "testserver"])

if env.str("DATABASE_URL", default=""):
    DATABASES = {"default": env.db("DATABASE_URL")}
else:
    import warnings

    # pgserver asks platformdirs for a runtime dir; as root without XDG_RUNTIME_DIR
    # that warns on every command, though the fallback works fine.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    from django_pgjobs.testing.embedded import database_url

    DATABASES = {"default": env.db_url_config(database_url(BASE_DIR / ".pgdata"))}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgjobs",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

PGJOBS = {
    # Short backoff so the demo's failed jobs are retried while you watch: a job
    # failing attempt n waits uniform(0, min(CAP, BASE * 2**(n-1))) seconds. The
    # defaults (1 s, capped at 1 h) suit real outages, where retrying within a
    # second would only hammer a struggling service. Do not copy these to production.
    "BACKOFF_BASE": 0.2,
    "BACKOFF_CAP": 2,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # INFO shows each retry and dead letter in the `runjobs` terminal.
    "loggers": {"django_pgjobs": {"handlers": ["console"], "level": "INFO"}},
}
