"""The worker rows (one per live ``runjobs`` process), and what they say about deploy skew:
the tasks live workers know, and the jobs of tasks none of them knows."""

from __future__ import annotations

from typing import Any

from django_pgjobs.db.error_history import dead_letter
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import HELD_SLOT, JOB, KNOWN_TASK, WORKER
from django_pgjobs.states import JobStatus

# Register a worker (or refresh its row: the heartbeat thread, every interval; the
# heartbeat process while the thread cannot). ``degraded``: why it runs without its
# heartbeat process now, empty while it has one (jobs_status and the admin show it).
WORKER_UPSERT = f"""
INSERT INTO {WORKER} (id, host, pid, queues, concurrency, started_at, last_seen, tasks,
                      degraded)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, now(), now(),
        %(tasks)s::jsonb, %(degraded)s)
ON CONFLICT (id) DO UPDATE SET last_seen = now(), degraded = excluded.degraded
"""

# A worker's clean exit: its row, and the limit slots it still holds for runs it
# abandoned (db/held_slots.py), whose threads end with its process.
WORKER_DELETE = f"""
WITH slots AS (DELETE FROM {HELD_SLOT} WHERE worker = %(id)s)
DELETE FROM {WORKER} WHERE id = %(id)s
"""

# Forget workers not seen for a long time (crashed without saying goodbye).
WORKER_FORGET_STALE = f"""
DELETE FROM {WORKER} WHERE last_seen < now() - make_interval(secs => %(older_than)s)
"""

# Is this worker's row fresh (its heartbeat reached the database within %s seconds)?
# The liveness file's check (health/health_file.py), by primary key.
WORKER_FRESH = f"SELECT last_seen > now() - make_interval(secs => %s) FROM {WORKER} WHERE id = %s"

# Is any worker alive at all (seen within %s seconds)?
WORKER_ANY_LIVE = (
    f"SELECT 1 FROM {WORKER} WHERE last_seen > now() - make_interval(secs => %s) LIMIT 1"
)


def _task_names(column: str) -> str:
    """The task names of a worker row's ``tasks`` array, as text rows; a row whose
    ``tasks`` is not an array (written by psql) knows no task rather than making
    the statement fail for every worker ("cannot extract elements from a scalar")."""
    return (
        f"jsonb_array_elements_text(CASE WHEN jsonb_typeof({column}) = 'array' "
        f"THEN {column} ELSE '[]'::jsonb END)"
    )


# Record, from the live workers' rows, that their tasks are known now. Rows are
# rewritten at most once per %(every)s seconds (no write churn on every pass).
KNOWN_TASKS_TOUCH = f"""
INSERT INTO {KNOWN_TASK} (name, last_known)
SELECT DISTINCT t.name, now()
  FROM {WORKER} w, {_task_names("w.tasks")} AS t(name)
 WHERE w.last_seen > now() - make_interval(secs => %(stale_after)s)
   AND t.name IS NOT NULL  -- a JSON null in a row psql wrote
ON CONFLICT (name) DO UPDATE SET last_known = excluded.last_known
 WHERE {KNOWN_TASK}.last_known < now() - make_interval(secs => %(every)s)
"""

# Dead-letter pending jobs whose task no live worker has known for the timeout.
# Three conditions, all conservative: the job has been due for the timeout, no
# worker has known its task within the timeout, and some live worker has been up
# for the whole timeout (so an outage followed by one old worker starting does not
# dead-letter new work that the next new worker would run). SKIP LOCKED and the
# lease bump as for the reaper; a batch per pass.
JOB_DEAD_UNKNOWN = f"""
WITH doomed AS (
    SELECT j.id FROM {JOB} j
     WHERE j.status = '{JobStatus.PENDING}'
       AND j.run_at < now() - make_interval(secs => %(timeout)s)
       AND NOT EXISTS (SELECT 1 FROM {KNOWN_TASK} k
                        WHERE k.name = j.task
                          AND k.last_known > now() - make_interval(secs => %(timeout)s))
       AND EXISTS (SELECT 1 FROM {WORKER} w
                    WHERE w.last_seen > now() - make_interval(secs => %(stale_after)s)
                      AND w.started_at < now() - make_interval(secs => %(timeout)s))
     ORDER BY j.id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
)
{dead_letter("doomed", type="%(type)s::text", message="format(%(message)s::text, j.task)", worker="NULL", last_error="%(type)s::text || ': ' || format(%(message)s::text, j.task)")}
"""
declare("JOB_DEAD_UNKNOWN", (JobStatus.PENDING, JobStatus.DEAD))

# Pending jobs per task that no live worker knows (for jobs_status and the admin).
# `<> ALL(array)` is hashed; reads the pending rows through the claim index. No locks.
UNKNOWN_PENDING = f"""
WITH known AS (
    -- array_remove: a JSON null in a row psql wrote would make every <> ALL unknown
    SELECT array_remove(ARRAY(SELECT DISTINCT {_task_names("w.tasks")} FROM {WORKER} w
                  WHERE w.last_seen > now() - make_interval(secs => %(stale_after)s)),
                  NULL) AS names
)
SELECT j.task, j.queue, count(*), now() - min(j.created_at)
  FROM {JOB} j, known
 WHERE j.status = '{JobStatus.PENDING}' AND j.task <> ALL(known.names)
 GROUP BY j.task, j.queue
 ORDER BY count(*) DESC, j.task
 LIMIT 100
"""

# Task names known by live workers (the admin's "known to a live worker" filter).
LIVE_TASKS = f"""
SELECT DISTINCT {_task_names("tasks")} FROM {WORKER}
 WHERE last_seen > now() - make_interval(secs => %(stale_after)s)
"""


def unknown_pending(connection: Any, *, stale_after: float) -> list[dict[str, Any]]:
    """UNKNOWN_PENDING: ``[{"task", "queue", "pending", "oldest"}]`` of jobs no live
    worker knows (nothing when no worker is alive at all: ``jobs_status`` says so)."""
    with connection.cursor() as cursor:
        cursor.execute(WORKER_ANY_LIVE, [stale_after])
        if cursor.fetchone() is None:
            return []
        cursor.execute(UNKNOWN_PENDING, {"stale_after": stale_after})
        return [
            {"task": r[0], "queue": r[1], "pending": r[2], "oldest": r[3].total_seconds()}
            for r in cursor.fetchall()
        ]


def live_tasks(connection: Any, *, stale_after: float) -> set[str]:
    """LIVE_TASKS: the task names live workers know."""
    with connection.cursor() as cursor:
        cursor.execute(LIVE_TASKS, {"stale_after": stale_after})
        return {r[0] for r in cursor.fetchall() if r[0] is not None}
