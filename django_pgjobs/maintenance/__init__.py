"""Passes that keep the table healthy, run by every ``runjobs`` (no leader):
``reaper`` (lost workers), ``pruner`` (finished history), ``cron`` (the built-in
schedules), ``pgcron`` (the pg_cron alternative), ``unknown_tasks`` (jobs of tasks
no live worker knows); ``services`` schedules them.
"""
