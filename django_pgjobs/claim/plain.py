"""The plain claim's hand-written parts: the UPDATE that marks the picked rows running,
the outer queries of the several-queue and every-queue claims, and the pending-queue
list. The inner query that picks the rows is compiled from ``Job.objects.claimable()``
by ``compiled.py``, which puts the ``JOB_CLAIM_*`` statements together from these;
``job_claim`` runs one."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

from django_pgjobs.claim.rows import Claimed, from_rows
from django_pgjobs.db.cursor import Connection, hot_cursor
from django_pgjobs.db.epoch import epoch_us
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import ASYNC_COMMIT, JOB, pending_queues_cte
from django_pgjobs.states import JobStatus

# Where the claim's SQL comes from. The rows a claim takes are the queryset
# ``Job.objects.claimable(queue)`` (jobs/managers.py): due pending jobs in claim-index
# order, ``select_for_update(skip_locked=True)``. It is compiled once per database
# vendor, on first use and without a round trip (compiled.claim_statements), into the inner
# SELECT of one ``WITH picked AS (...) UPDATE ... RETURNING`` statement, so a claim
# stays one round trip with one constant text that the server prepares once.
# Hand-written around it, because the ORM cannot say it at no cost: the UPDATE that
# joins the locked CTE and returns the claimed rows (QuerySet.update() neither joins
# a CTE nor returns rows: two round trips); the several-queues claim's outer query,
# which runs the queryset once per queue as a LATERAL subquery of unnest(...) (no
# LATERAL or set-returning FROM in the ORM); the every-queue claim's queue list, a
# recursive CTE (no WITH RECURSIVE in the ORM; its two index probes are one line
# each, and ACTIVE_QUEUES shares it); and the limited claim (limited.py), whose
# per-queue scan reads the CTEs ``allowance`` and ``busy`` and locks rows only after
# ranking them.

# Marks the rows of ``picked`` as claimed. attempts and lease are bumped at claim
# time, so a crash mid-job still counts the attempt and a reclaimed job can be told
# from its zombie. The rows are found with ``id = ANY (ARRAY(SELECT id FROM
# picked))``, a primary-key probe per id whatever the statistics say: joined as
# ``FROM picked WHERE j.id = picked.id``, a table without statistics yet (a bulk
# enqueue into a new table, autovacuum not run) is estimated at a few rows per
# page, and the prepared statement's generic plan became a hash join over a
# sequential scan of the whole table, a cost per claim that grew with the table
# (tests/db/test_perf_plans.py pins the plan).
#
# ``heartbeat_at`` is the clock when the row is claimed, not the transaction's start
# (``started_at``): a limited claim first waits for the flow lock (limited.py),
# as long as another worker holds it, and a heartbeat as old as that wait could be
# older than STALE_AFTER when the claim commits; the reaper would take the rows from
# this live worker before its first beat.
_CLAIM_SET = f"""
UPDATE {JOB} AS j
   SET status = '{JobStatus.RUNNING}',
       attempts = j.attempts + 1,
       lease = j.lease + 1,
       started_at = now(),
       heartbeat_at = clock_timestamp(),
       worker = %(worker)s,
       -- unique_while="pending": a job stops holding its key once it starts
       unique_key = CASE WHEN left(j.unique_key, 8) = 'pending:' THEN NULL
                         ELSE j.unique_key END
  FROM {ASYNC_COMMIT}
 WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING j.id, j.task, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease, j.queue,
          j.priority, j.idempotency_key, j.timeout, j.trace_context,
          -- a workflow job with parents: the worker reads their results
          j.failed_parents IS NOT NULL,
          -- reclaimed from a lost worker: the worker runs it alone (worker/isolated.py)
          j.suspect,
          -- where the worker's next claim may start (claim/front.py)
          {epoch_us("j.run_at")}
"""


def mark_running() -> str:
    """The UPDATE that marks ``picked``'s rows running and returns them, for a claim
    put together elsewhere (the limited claim's ``claimed`` step)."""
    return _CLAIM_SET


# Claim up to n due jobs of ONE queue: ``picked`` is the compiled queryset
# (``WHERE status = 'pending' AND queue = %(queue)s AND run_at <= now() ORDER BY
# priority DESC, run_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED``), one range scan of
# the claim index that stops after n rows. The CTE is the "optimisation fence": the
# LIMIT applies to the locked set, so the UPDATE can never touch more rows than
# asked for. SKIP LOCKED makes competing workers take different rows instead of
# queueing behind each other.
def claim_one_queue(picked: str) -> str:
    return f"""
WITH picked AS (
    {picked}
)
{_CLAIM_SET}
"""


# Claim across several queues: each queue is scanned in index order (the compiled
# queryset for queue = qs.name, LATERAL, LIMIT n each) and the best n are taken.
# Rows of the per-queue scans that are not taken stay locked only for this statement.
def claim_queues(lateral: str) -> str:
    return f"""
WITH picked AS (
    SELECT c.id FROM unnest(%(queues)s::text[]) AS qs(name)
    CROSS JOIN LATERAL ({lateral}) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(n)s
)
{_CLAIM_SET}
"""


# Claim across queues and priority levels, from the claim front's bound: each pair
# (queue, priority) is one scan of the claim index that starts AT the bound (index
# condition ``queue = qs.name AND priority = lv.p AND run_at >= since``); the other
# claims' bound is only a filter on the entries after ``queue = ...``, since priority
# comes before run_at in the index, so they still step over the entries of every job
# claimed since VACUUM last ran (under a held xmin horizon that walk grows with every
# job claimed; seeking by level does not). The worker passes the priorities
# that its queues' pending jobs at or past the bound can have (claim/front.py);
# rows of the scans that are not taken stay locked only for this statement.
def claim_levels(lateral: str) -> str:
    return f"""
WITH picked AS (
    SELECT c.id FROM unnest(%(queues)s::text[]) AS qs(name)
    CROSS JOIN unnest(%(levels)s::int[]) AS lv(p)
    CROSS JOIN LATERAL ({lateral}) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(n)s
)
{_CLAIM_SET}
"""


# A worker's claims and its list of queues start at its claim front (claim/front.py):
# every pending job at or past the bound is found, due or not, and none is before it
# that a claim could take (a claim that reads the whole index reads the whole list).
_PENDING_QUEUES_SINCE = pending_queues_cte(" AND run_at >= %(since)s")

#: ``since`` of a claim from the start of the claim index (no bound: every run_at is
#: later; PostgreSQL's timestamptz reaches back to 4713 BC).
UNBOUNDED = datetime(1, 1, 1, tzinfo=UTC)


# The queues with pending rows, on their own: what a worker of every queue claims
# from (claimant.Claimant keeps the list: refreshed every POLL_INTERVAL, after LISTEN
# reconnected and after an empty claim without LISTEN; a NOTIFY adds its queue). Its
# claims are then JOB_CLAIM_ONE_QUEUE / JOB_CLAIM_QUEUES, which walk the claim
# index once per queue, where JOB_CLAIM_ALL walks it twice (this probe, then the
# LATERAL scan): until VACUUM, each walk steps over the index entries every
# claimed job left behind, so one walk per claim costs the server less per job.
# Read-only.
PENDING_QUEUES = f"""
WITH RECURSIVE {_PENDING_QUEUES_SINCE}
SELECT name FROM qs WHERE name IS NOT NULL
"""


# Claim from every queue: the pending queues (loose index scan), then as above.
# run.claim(queues=None) without a task filter; the worker claims through
# PENDING_QUEUES instead (above).
def claim_all(lateral: str) -> str:
    return f"""
WITH RECURSIVE {_PENDING_QUEUES_SINCE}, picked AS (
    SELECT c.id FROM qs
    CROSS JOIN LATERAL ({lateral}) AS c
    WHERE qs.name IS NOT NULL
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(n)s
)
{_CLAIM_SET}
"""


# Deploy skew: the *_KNOWN claims are the same three restricted to the tasks this
# worker knows (``claimable(tasks=...)``: a filter on the claim-index scan, no join,
# no lock), so a job of a task only newer code registers waits for a worker that
# knows it. The filter is array_position(%(tasks)s::text[], task::text) IS NOT NULL,
# not task = ANY(...), on purpose: the planner estimates ANY() from the task
# column's statistics (history included, or a default for a prepared statement's
# parameter), and a low estimate makes it trade the ordered index scan that stops
# after n rows for a bitmap scan plus a sort of the whole backlog. A function's IS
# NOT NULL is estimated at 99.5%, which is the truth: almost every pending job is
# of a known task.
CLAIM_STATEMENTS = (
    "JOB_CLAIM_ONE_QUEUE",
    "JOB_CLAIM_QUEUES",
    "JOB_CLAIM_ALL",
    "JOB_CLAIM_ONE_QUEUE_KNOWN",
    "JOB_CLAIM_QUEUES_KNOWN",
    "JOB_CLAIM_ALL_KNOWN",
    "JOB_CLAIM_LEVELS",
    "JOB_CLAIM_LEVELS_KNOWN",
)
for _name in CLAIM_STATEMENTS:
    declare(_name, (JobStatus.PENDING, JobStatus.RUNNING))


def pending_queues(connection: Connection, since: datetime | None = None) -> list[str]:
    """The names of the queues that have pending jobs (due or not), sorted; with
    ``since``, of those with ``run_at >= since``."""
    with hot_cursor(connection) as cursor:
        cursor.execute(PENDING_QUEUES, {"since": since or UNBOUNDED})
        return [row[0] for row in cursor.fetchall()]


@functools.lru_cache(maxsize=64)
def task_array(tasks: tuple[str, ...]) -> str:
    """The ``text[]`` literal of a worker's task names, built once: adapting a list of
    a hundred strings on every claim cost more than the filter itself."""
    quoted = ('"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"' for t in tasks)
    return "{" + ",".join(quoted) + "}"


def job_claim(connection: Connection, statement: str, params: dict[str, Any]) -> list[Claimed]:
    """Run one of the ``JOB_CLAIM_*`` statements (compiled by ``compiled.claim_statements``)."""
    with hot_cursor(connection) as cursor:
        if isinstance(connection, psycopg.Connection):
            # Django's psycopg setup loads jsonb as text; a plain connection would
            # decode it in fetchall(), where one undecodable row raises for the whole
            # batch after the claim committed. As text, from_rows decodes per row.
            for name in ("json", "jsonb"):
                cursor.adapters.register_loader(name, TextLoader)
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    return from_rows(rows)
