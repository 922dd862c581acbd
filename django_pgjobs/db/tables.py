"""The names the statements share: tables, the unique-key index, the NOTIFY channel, the
status test of rows looked up by id, the asynchronous commit of claims and heartbeats,
and the list of queues with pending jobs."""

from __future__ import annotations

from django_pgjobs.states import JobStatus

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
STEP = "django_pgjobs_jobstep"
SIGNAL = "django_pgjobs_jobsignal"
EVENT = "django_pgjobs_jobevent"

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
# several times over. tests/db/test_perf_plans.py pins the plans.
def by_id_is(*statuses: str, column: str = "status") -> str:
    if len(statuses) == 1:
        return f"{column} = '{statuses[0]}' COLLATE \"C\""
    listed = ", ".join(f"'{status}'" for status in statuses)
    return f'{column} COLLATE "C" IN ({listed})'


# Claims commit asynchronously: set_config(..., true) is local to the statement's
# own transaction (no session state, so pgbouncer-safe) and is still in force
# when it commits, so the claim does not wait for a WAL flush. Safe: a claim lost
# in a server crash leaves the job pending and it runs again (at-least-once), and
# the completion, which commits synchronously, flushes the claim's WAL before it.
ASYNC_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"


# The queues that have pending rows, found with a loose index scan of the claim
# index: one index probe per distinct queue, not a read of every pending row.
# A recursive CTE named qs(name), for WITH RECURSIVE; its last row is NULL.
# ``bound``: a condition on run_at checked on the index entries (the claim front).
def pending_queues_cte(bound: str = "") -> str:
    return f"""qs(name) AS (
    (SELECT queue FROM {JOB} WHERE status = '{JobStatus.PENDING}'{bound} ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM {JOB}
             WHERE status = '{JobStatus.PENDING}' AND queue > qs.name{bound}
             ORDER BY queue LIMIT 1)
      FROM qs WHERE qs.name IS NOT NULL
)"""
