"""Minimal settings: one database (``$BENCH_DB`` on the harness's server), our app,
and the app holding the benchmark's no-op job. Logging at WARNING, like the peers."""

import os

SECRET_KEY = "bench"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_pgjobs", "dj_pgjobs"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BENCH_DB", "bench_django_pgjobs"),
        "USER": os.environ.get("BENCH_PGUSER", "postgres"),
        "HOST": os.environ.get("BENCH_PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_PGPORT", "5432"),
        "CONN_MAX_AGE": None,
        # Django's documented psycopg 3 options: server-side parameter binding, and
        # psycopg preparing a statement after it ran 5 times (enqueue, claim,
        # complete). Not for pgbouncer < 1.21 in transaction mode (docs/howto/pgbouncer.md).
        "OPTIONS": (
            {"server_side_binding": True, "prepare_threshold": 5}
            if os.environ.get("BENCH_PGJOBS_PREPARE", "0") == "1"
            else {}
        ),
    }
}
PGJOBS = {
    "POLL_INTERVAL": float(os.environ.get("BENCH_PGJOBS_POLL", "1.0")),
    "LISTEN": os.environ.get("BENCH_PGJOBS_LISTEN", "1") == "1",
}
# The long soak prunes during the run: completed jobs kept this many seconds, and
# each worker's pruner pass this often (unset: the package's defaults).
if os.environ.get("BENCH_PGJOBS_RETENTION"):
    PGJOBS["RETENTION"] = {"completed": float(os.environ["BENCH_PGJOBS_RETENTION"])}
# BENCH_PGJOBS_PULSE=0: no heartbeat process (HEARTBEAT_PROCESS), to measure its cost.
if os.environ.get("BENCH_PGJOBS_PULSE"):
    PGJOBS["HEARTBEAT_PROCESS"] = os.environ["BENCH_PGJOBS_PULSE"] == "1"
if os.environ.get("BENCH_PGJOBS_PRUNER_INTERVAL"):
    PGJOBS["PRUNER_INTERVAL"] = float(os.environ["BENCH_PGJOBS_PRUNER_INTERVAL"])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
