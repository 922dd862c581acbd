"""The names the statements share: tables, the unique-key index, the NOTIFY channel, and
the status test of rows looked up by id."""

from __future__ import annotations

JOB = "django_pgjobs_job"
RESULT = "django_pgjobs_jobresult"
WORKER = "django_pgjobs_worker"
QUEUE = "django_pgjobs_queue"
KNOWN_TASK = "django_pgjobs_knowntask"
WORKFLOW = "django_pgjobs_workflow"
DEPENDENCY = "django_pgjobs_jobdependency"
HELD_SLOT = "django_pgjobs_heldslot"
MINUTE = "django_pgjobs_minute"
ROLLUP_MARK = "django_pgjobs_rollupmark"

#: The channel of every wake-up NOTIFY (payload: the queue name).
NOTIFY_CHANNEL = "pgjobs"

#: The partial unique index that holds unique_while keys (models.Job.Meta).
UNIQUE_ACTIVE_INDEX = "pgjobs_job_unique_active_uniq"


# Rows looked up BY ID test their status through by_id_is(...): ``status = 'running'
# COLLATE "C"``. Same truth (equality does not depend on the collation), but it no
# longer matches the predicate of the partial indexes (running_idx: status =
# 'running'; status_idx: status IN (...)), so the planner cannot pick them and
# always goes through the primary key, one probe per id. Why: after an ANALYZE that
# saw (almost) no running or completed rows — autovacuum analyses an idle queue, or
# the table right after a bulk enqueue — the planner estimates one row for the
# status and prefers to scan the whole partial index and hash-join it with the ids.
# That scan walks every running row plus the dead index entries of every job that
# passed through running (or, for the completed check, every completed row of the
# history), a cost per completion batch that grows with the table and slows a drain
# several times over. tests/test_perf_plans.py pins the plans.
def by_id_is(*statuses: str, column: str = "status") -> str:
    if len(statuses) == 1:
        return f"{column} = '{statuses[0]}' COLLATE \"C\""
    listed = ", ".join(f"'{status}'" for status in statuses)
    return f'{column} COLLATE "C" IN ({listed})'
