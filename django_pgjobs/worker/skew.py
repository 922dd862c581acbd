"""Deploy skew: jobs whose task no live worker knows.

During a rolling deploy new web code can enqueue a task that the still-old
workers do not have. Workers claim only the tasks they know (``Worker.tasks``,
``sql.JOB_CLAIM_*_KNOWN``), so such jobs simply wait. This module shows them
(``jobs_status``, the admin) and, as a maintenance pass, dead-letters a job only
when no live worker has known its task for ``UNKNOWN_TASK_TIMEOUT``: a task that
was removed from the code, or a ``@job`` that no worker ever imports.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

from django_pgjobs import sql
from django_pgjobs.conf import get_settings
from django_pgjobs.exceptions import UnknownTask
from django_pgjobs.states import JobStatus

logger = logging.getLogger("django_pgjobs")

KNOWN_TASK = "django_pgjobs_knowntask"

#: Where ``@job`` functions must live to be found (said in errors and docs).
DISCOVERY_HINT = (
    "@job functions are registered when their module is imported: django-pgjobs imports "
    "the `jobs` module of every installed app (myapp/jobs.py) and the modules listed in "
    "PGJOBS['JOB_MODULES']; a @job defined anywhere else is unknown to workers"
)

# Record, from the live workers' rows, that their tasks are known now. Rows are
# rewritten at most once per %(every)s seconds (no write churn on every pass).
KNOWN_TASKS_TOUCH = f"""
INSERT INTO {KNOWN_TASK} (name, last_known)
SELECT DISTINCT t.name, now()
  FROM {sql.WORKER} w, jsonb_array_elements_text(w.tasks) AS t(name)
 WHERE w.last_seen > now() - make_interval(secs => %(stale_after)s)
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
    SELECT j.id FROM {sql.JOB} j
     WHERE j.status = '{JobStatus.PENDING}'
       AND j.run_at < now() - make_interval(secs => %(timeout)s)
       AND NOT EXISTS (SELECT 1 FROM {KNOWN_TASK} k
                        WHERE k.name = j.task
                          AND k.last_known > now() - make_interval(secs => %(timeout)s))
       AND EXISTS (SELECT 1 FROM {sql.WORKER} w
                    WHERE w.last_seen > now() - make_interval(secs => %(stale_after)s)
                      AND w.started_at < now() - make_interval(secs => %(timeout)s))
     ORDER BY j.id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
)
UPDATE {sql.JOB} AS j
   SET status = '{JobStatus.DEAD}', finished_at = now(), lease = j.lease + 1,
       errors = j.errors || jsonb_build_array(jsonb_build_object(
           'attempt', j.attempts, 'at', now(), 'type', %(type)s::text,
           'message', format(%(message)s::text, j.task), 'traceback', NULL, 'worker', NULL)),
       last_error = %(type)s::text || ': ' || format(%(message)s::text, j.task)
  FROM doomed
 WHERE j.id = doomed.id
RETURNING j.id, j.task
"""

# Pending jobs per task that no live worker knows (for jobs_status and the admin).
# `<> ALL(array)` is hashed; reads the pending rows through the claim index. No locks.
UNKNOWN_PENDING = f"""
WITH known AS (
    SELECT ARRAY(SELECT DISTINCT jsonb_array_elements_text(w.tasks) FROM {sql.WORKER} w
                  WHERE w.last_seen > now() - make_interval(secs => %(stale_after)s)) AS names
)
SELECT j.task, j.queue, count(*), now() - min(j.created_at)
  FROM {sql.JOB} j, known
 WHERE j.status = '{JobStatus.PENDING}' AND j.task <> ALL(known.names)
 GROUP BY j.task, j.queue
 ORDER BY count(*) DESC, j.task
 LIMIT 100
"""

# Task names known by live workers (the admin's "known to a live worker" filter).
LIVE_TASKS = f"""
SELECT DISTINCT jsonb_array_elements_text(tasks) FROM {sql.WORKER}
 WHERE last_seen > now() - make_interval(secs => %(stale_after)s)
"""


def unknown_message(timeout: float) -> str:
    """A format() pattern for PostgreSQL: %L becomes the quoted task name."""
    return (
        f"unknown task %L: no live worker has known it for {timeout:g}s "
        f"(UNKNOWN_TASK_TIMEOUT). {DISCOVERY_HINT}."
    )


def unknown_pending(connection: Any, *, stale_after: float) -> list[dict[str, Any]]:
    """``[{"task", "queue", "pending", "oldest"}]`` of jobs no live worker knows."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM " + sql.WORKER + " WHERE last_seen > now() - "
            "make_interval(secs => %s) LIMIT 1",
            [stale_after],
        )
        if cursor.fetchone() is None:
            return []  # no live worker at all: jobs_status says so already
        cursor.execute(UNKNOWN_PENDING, {"stale_after": stale_after})
        return [
            {"task": r[0], "queue": r[1], "pending": r[2], "oldest": r[3].total_seconds()}
            for r in cursor.fetchall()
        ]


def live_tasks(connection: Any, *, stale_after: float) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(LIVE_TASKS, {"stale_after": stale_after})
        return {r[0] for r in cursor.fetchall()}


class UnknownTaskSweeper:
    """Maintenance service: keep ``KnownTask`` fresh and dead-letter jobs whose task
    no live worker has known for ``UNKNOWN_TASK_TIMEOUT``."""

    name = "unknown-tasks"

    def __init__(self, *, alias: str, batch: int = 500):
        conf = get_settings()
        self.alias = alias
        self.batch = batch
        self.timeout = conf.UNKNOWN_TASK_TIMEOUT
        self.stale_after = conf.STALE_AFTER
        self.interval = max(0.5, min(60.0, self.timeout / 4))

    def run_once(self) -> dict[str, Any]:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(
                KNOWN_TASKS_TOUCH, {"stale_after": self.stale_after, "every": self.interval / 2}
            )
            cursor.execute(
                JOB_DEAD_UNKNOWN,
                {
                    "timeout": self.timeout,
                    "stale_after": self.stale_after,
                    "batch": self.batch,
                    "type": f"{UnknownTask.__module__}.{UnknownTask.__qualname__}",
                    "message": unknown_message(self.timeout),
                },
            )
            dead = cursor.fetchall()
        for job_id, task in dead:
            logger.error(
                "job %s dead-lettered: unknown task %r (no live worker has known it for %gs). %s",
                job_id,
                task,
                self.timeout,
                DISCOVERY_HINT,
                extra={"job_id": job_id, "task": task},
            )
        return {"dead": len(dead)}
