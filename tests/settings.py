"""Test settings. The database comes from, in order:

1. ``DATABASE_URL`` (read with django-environ);
2. a testcontainers PostgreSQL, when a Docker engine answers;
3. an embedded ``pgserver`` in the temp folder.

Importing these settings starts nothing: without ``DATABASE_URL`` the server is
chosen (and started) only when a test first needs the database (tests/dbrig.py),
so mypy's Django plugin and ``makemigrations --check`` never boot PostgreSQL. The
chosen URL is exported as ``DATABASE_URL`` so that ``runjobs`` subprocesses
started by the tests use the same server.
"""

from __future__ import annotations

import os
import sys
import tempfile

import django

from tests.dbrig import UNCHOSEN_ENGINE, database_config

if os.environ.get("PGJOBS_TEST_PROBE_EVERY"):
    # The fault matrix's claim-front rows: the worker's probe often enough to fault.
    from django_pgjobs.claim import front as claim_front

    claim_front.PROBE_EVERY = float(os.environ["PGJOBS_TEST_PROBE_EVERY"])

SECRET_KEY = "django-pgjobs-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": (
        database_config(os.environ["DATABASE_URL"])
        if os.environ.get("DATABASE_URL")
        # No server yet: tests/conftest.py chooses one when a test needs the database.
        else {"ENGINE": UNCHOSEN_ENGINE}
    )
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgjobs",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

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

STATIC_URL = "/static/"

# Short timings so crash tests finish in seconds (documented defaults are 5s/30s).
PGJOBS = {
    "HEARTBEAT_INTERVAL": float(os.environ.get("PGJOBS_TEST_HEARTBEAT", "0.5")),
    "STALE_AFTER": float(os.environ.get("PGJOBS_TEST_STALE_AFTER", "2")),
    # tests/faults/matrix.py: the unknown-task sweeper's dead-letter cells.
    "UNKNOWN_TASK_TIMEOUT": float(os.environ.get("PGJOBS_TEST_UNKNOWN_TASK_TIMEOUT", "3600")),
    "REAPER_INTERVAL": 0.5,
    # tests/process/test_durable_waits_process.py: only a NOTIFY wakes a worker in time.
    "POLL_INTERVAL": float(os.environ.get("PGJOBS_TEST_POLL_INTERVAL", "0.5")),
    "SHUTDOWN_TIMEOUT": float(os.environ.get("PGJOBS_TEST_SHUTDOWN_TIMEOUT", "5")),
    # tests/process/test_heartbeat_process.py: the worker's heartbeat process off ("0").
    "HEARTBEAT_PROCESS": os.environ.get("PGJOBS_TEST_HEARTBEAT_PROCESS", "1") == "1",
    "BACKOFF_BASE": 0.05,
    "BACKOFF_CAP": 0.2,
    # Flow-control test jobs live outside an app's jobs module (PGJOBS["JOB_MODULES"]);
    # a worker started with PGJOBS_TEST_OLD_WORKER=1 lacks them (a rolling deploy).
    # Workers load the job with a concurrency key only with PGJOBS_TEST_KEYED=1, so
    # the other tests' workers keep the unlimited fast-path claim.
    "JOB_MODULES": (
        []
        if os.environ.get("PGJOBS_TEST_OLD_WORKER")
        else [
            "tests.flow_jobs",
            "tests.workflow_jobs",
            "tests.durable_jobs",
            "tests.chunk_jobs",
            "tests.signal_jobs",
        ]
    )
    + (
        ["tests.flow_keyed_jobs"]
        if "pytest" in sys.modules or os.environ.get("PGJOBS_TEST_KEYED")
        else []
    )
    # Fair-share test jobs: their workers run with PGJOBS_TEST_FAIR=1.
    + (["tests.fair_jobs"] if "pytest" in sys.modules or os.environ.get("PGJOBS_TEST_FAIR") else [])
    # The model-based test's jobs (tests/model/): its workers run with PGJOBS_TEST_MODEL=1.
    + (
        ["tests.model.jobs"]
        if "pytest" in sys.modules or os.environ.get("PGJOBS_TEST_MODEL")
        else []
    ),
}
if os.environ.get("PGJOBS_TEST_METRICS_PORT"):  # tests/process/test_metrics_process.py
    PGJOBS["METRICS_PORT"] = int(os.environ["PGJOBS_TEST_METRICS_PORT"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_pgjobs": {"handlers": ["console"], "level": "INFO"}},
}

if os.environ.get("PGJOBS_TEST_MODEL"):
    # The model-based test's workers (tests/model/) stamp each line with its time: a
    # restart's line says when its abandoned threads ended.
    LOGGING["formatters"] = {"stamped": {"format": "{created:.3f} {message}", "style": "{"}}
    LOGGING["handlers"]["console"]["formatter"] = "stamped"  # type: ignore[index]

TEMP_DIR = tempfile.gettempdir()

if os.environ.get("PGJOBS_TEST_BATCH_ABANDONED_AFTER"):  # tests/faults/matrix_cells.py
    PGJOBS["BATCH_ABANDONED_AFTER"] = float(os.environ["PGJOBS_TEST_BATCH_ABANDONED_AFTER"])
if os.environ.get("PGJOBS_TEST_HEALTH_STUCK_AFTER"):  # tests/process/test_liveness.py
    PGJOBS["HEALTH_STUCK_AFTER"] = float(os.environ["PGJOBS_TEST_HEALTH_STUCK_AFTER"])
if os.environ.get("PGJOBS_TEST_METRICS_ADDRESS"):  # tests/process/test_metrics_bounded.py
    PGJOBS["METRICS_ADDRESS"] = os.environ["PGJOBS_TEST_METRICS_ADDRESS"]
if os.environ.get("PGJOBS_TEST_OTEL_FILE"):
    # A runjobs subprocess of tests/db/test_tracing.py: export its spans to this file.
    from tests.helpers.otel_export import install

    install(os.environ["PGJOBS_TEST_OTEL_FILE"])

if django.VERSION >= (6, 0):
    # django.tasks on our queue (tests/tasks_backend); its tasks.py is autodiscovered.
    INSTALLED_APPS.append("tests.tasks_backend")
    from tests.tasks_backend.config import TASKS  # noqa: F401

if os.environ.get("PGJOBS_FAULT_PLAN"):
    # Statement-level fault injection (tests/faults/injector.py): test-only, installed
    # in runjobs subprocesses started by the fault matrix.
    from tests.faults.injector import install as _install_fault_injector

    _install_fault_injector()
