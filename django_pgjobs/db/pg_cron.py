"""The statements of the pg_cron engine (``maintenance/pg_cron_engine.py``): find pg_cron, read and
write the ``cron.job`` entries, and the command an entry runs."""

from __future__ import annotations

# Where pg_cron lives: this database, the server's pg_cron database, and whether the
# extension is installed here or could be. Catalog and settings only.
CRON_LOCATE = (
    "SELECT current_database(), current_user, current_setting('server_version_num'),"
    " current_setting('cron.database_name', true),"
    " (SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'),"
    " EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_cron')"
)

# The extension's version in the pg_cron database (no row: not created there).
CRON_VERSION = "SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'"

# One sync at a time per server: a second concurrent sync waits, then sees ours.
# Transaction-level, released at COMMIT.
CRON_SYNC_LOCK = "SELECT pg_advisory_xact_lock(hashtext('django_pgjobs.sync_cron'))"

# Our entries (jobname LIKE 'pgjobs:%') for the application database.
CRON_ENTRIES = (
    "SELECT jobid, jobname, schedule, command, database, username, active "
    "FROM cron.job WHERE jobname LIKE %s AND database = %s"
)

# Create or update an entry (pg_cron matches on jobname): in this database, or in
# another one from the pg_cron database (active). The user is left NULL: pg_cron then
# takes current_user, which the sync's connection shares with Django's (the same
# credentials and role); a user named, even one's own, needs a superuser.
CRON_SCHEDULE = "SELECT cron.schedule(%s, %s, %s)"
CRON_SCHEDULE_IN_DATABASE = "SELECT cron.schedule_in_database(%s, %s, %s, %s, NULL, true)"
CRON_UNSCHEDULE = "SELECT cron.unschedule(%s::bigint)"

# What an entry of a schedule runs: enqueue one job whose idempotency key is
# ``cron:<name>:`` plus the minute it runs in, UTC, formatted as the built-in
# ticker's KEY_TIME_FORMAT, so running both engines makes one job per fire time.
CRON_ENQUEUE = (
    "SELECT pgjobs_enqueue(%s, %s::jsonb, %s::jsonb, %s, %s, NULL, "
    "%s || to_char(date_trunc('minute', now() AT TIME ZONE 'UTC'), %s), %s)"
)
