"""Passes that keep the table healthy, run by every ``runjobs`` (no leader):
``reaper`` (lost workers), ``pruner`` (finished history), ``cron`` (the built-in
schedules), ``pgcron`` (the pg_cron alternative); ``services`` schedules them.
"""
