"""Every hand-written statement of the hot path, and thin wrappers around them.

Why raw SQL: each statement here is one round trip that the ORM would split into
several (select-then-update, update-then-insert). Locking rules, used everywhere:

* claims and the reaper take rows with ``FOR UPDATE SKIP LOCKED``: they never wait
  for another worker and never deadlock with one;
* every multi-row write that *waits* for locks (heartbeat, complete, admin
  actions) first locks its rows in ``id`` order, so two of them can never wait on
  each other in a cycle;
* every write about a claimed job is fenced by ``lease = <the claimed lease>``: a
  zombie's late write matches zero rows and changes nothing.

Statements run in autocommit unless the caller has a transaction open (enqueue
joins the caller's transaction on purpose).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.states import PRIORITY_MAX, PRIORITY_MIN, JobStatus
from django_pgjobs.validation import MAX_DEPTH as MAX_JSON_DEPTH

#: What the statement functions that take it run on: Django's connection, or a plain
#: psycopg connection (the fault suite and the benchmark drive them with their own).
#: Functions that need Django's transactions or query logging take BaseDatabaseWrapper.
#: Tell them apart by the psycopg class: ``django.db.connection`` is a proxy, not a
#: BaseDatabaseWrapper instance.
Connection: TypeAlias = "BaseDatabaseWrapper | psycopg.Connection[Any]"

JOB = "django_pgjobs_job"
RESULT = "django_pgjobs_jobresult"
WORKER = "django_pgjobs_worker"
NOTIFY_CHANNEL = "pgjobs"

# ---------------------------------------------------------------------------
# Enqueue
# ---------------------------------------------------------------------------

# The JOB_INSERT family: insert one job and wake idle workers, in one statement.
# One column list serves every member; a member adds the flow-control columns, or
# takes run_at as a delay, and nothing else. Parameters are named after their
# column (build them with insert_params, which fills the ones not given with NULL):
# a new column is one line here, not a positional None at every caller.
_INSERT_COLUMNS = (
    ("task", "%(task)s"),
    ("queue", "%(queue)s"),
    ("priority", "%(priority)s"),
    ("args", "%(args)s::jsonb"),
    ("kwargs", "%(kwargs)s::jsonb"),
    # an absolute time (NULL: now), or for .using(delay=...) the database's now()
    # plus the delay, the clock every other time of a job (claims, leases, backoff)
    # is read from
    ("run_at", "COALESCE(%(run_at)s, now())"),
    ("max_attempts", "%(max_attempts)s"),
    ("idempotency_key", "%(idempotency_key)s"),
    ("timeout", "%(timeout)s"),
    ("trace_context", "%(trace_context)s::jsonb"),
)
_FLOW_COLUMNS = (
    ("concurrency_key", "%(concurrency_key)s"),
    ("concurrency_limit", "%(concurrency_limit)s"),
    ("unique_key", "%(unique_key)s"),
)
_DELAYED_RUN_AT = "now() + make_interval(secs => %(delay)s)"
INSERT_PARAMS = frozenset([name for name, _ in _INSERT_COLUMNS + _FLOW_COLUMNS] + ["delay"])


def insert_params(**values: Any) -> dict[str, Any]:
    """Parameters for any member of the JOB_INSERT family: ``values`` by column
    name (``delay``: seconds, for the _DELAYED members), NULL for the others."""
    unknown = values.keys() - INSERT_PARAMS
    if unknown:
        raise TypeError(f"not a parameter of the job insert: {', '.join(sorted(unknown))}")
    return dict.fromkeys(INSERT_PARAMS) | values


# ON CONFLICT on the unique idempotency key waits for a concurrent inserter of the
# same key to commit or roll back, then does nothing (the caller then reads the
# winner's row), so concurrent enqueues of one key produce exactly one row. The
# flow members (concurrency key, unique_while key) say ON CONFLICT DO NOTHING
# without a target, which covers both partial unique indexes (idempotency key;
# unique key among pending/running jobs) the same way. pg_notify is delivered at
# commit, so a rolled-back enqueue wakes nobody.
def _job_insert(*, flow: bool, delayed: bool) -> str:
    columns = _INSERT_COLUMNS + (_FLOW_COLUMNS if flow else ())
    values = [_DELAYED_RUN_AT if delayed and name == "run_at" else value for name, value in columns]
    conflict = "" if flow else " (idempotency_key) WHERE idempotency_key IS NOT NULL"
    return f"""
WITH ins AS (
    INSERT INTO {JOB} ({", ".join(name for name, _ in columns)})
    VALUES ({", ".join(values)})
    ON CONFLICT{conflict} DO NOTHING
    RETURNING id, queue, run_at, created_at
)
SELECT ins.id,
       -- times as exact epoch microseconds: cheaper to decode than timestamptz
       (extract(epoch FROM ins.run_at) * 1000000)::bigint,
       (extract(epoch FROM ins.created_at) * 1000000)::bigint,
       pg_notify('{NOTIFY_CHANNEL}', ins.queue)::text
  FROM ins
"""


JOB_INSERT = _job_insert(flow=False, delayed=False)
JOB_INSERT_DELAYED = _job_insert(flow=False, delayed=True)
# Only jobs with a concurrency key or a unique_while key take the flow members.
JOB_INSERT_FLOW = _job_insert(flow=True, delayed=False)
JOB_INSERT_FLOW_DELAYED = _job_insert(flow=True, delayed=True)


def job_insert(*, flow: bool = False, delayed: bool = False) -> str:
    """The member of the JOB_INSERT family for these options."""
    if flow:
        return JOB_INSERT_FLOW_DELAYED if delayed else JOB_INSERT_FLOW
    return JOB_INSERT_DELAYED if delayed else JOB_INSERT


# The run_at of a delayed bulk enqueue (COPY takes values, not expressions).
DELAYED_RUN_AT = "SELECT now() + make_interval(secs => %s)"

# The job holding a unique_while key (the partial unique index's predicate).
JOB_BY_UNIQUE_KEY_WHERE = (
    f"WHERE unique_key = %s AND status IN ('{JobStatus.PENDING}', '{JobStatus.RUNNING}')"
)

# The partial unique index that holds unique_while keys (models.Job.Meta).
UNIQUE_ACTIVE_INDEX = "pgjobs_job_unique_active_uniq"

# The existing job that owns an idempotency key (after ON CONFLICT DO NOTHING).
JOB_BY_KEY = f"SELECT {{columns}} FROM {JOB} WHERE idempotency_key = %s"

# Wake idle workers after a bulk COPY (one notification per queue per commit).
JOB_NOTIFY = f"SELECT pg_notify('{NOTIFY_CHANNEL}', %s)"

# ---------------------------------------------------------------------------
# Claim
# ---------------------------------------------------------------------------

# Where the claim's SQL comes from. The rows a claim takes are the queryset
# ``Job.objects.claimable(queue)`` (managers.py): due pending jobs in claim-index
# order, ``select_for_update(skip_locked=True)``. It is compiled once per database
# vendor, on first use and without a round trip (claim_statements), into the inner
# SELECT of one ``WITH picked AS (...) UPDATE ... RETURNING`` statement, so a claim
# stays one round trip with one constant text that the server prepares once.
# Hand-written around it, because the ORM cannot say it at no cost: the UPDATE that
# joins the locked CTE and returns the claimed rows (QuerySet.update() neither joins
# a CTE nor returns rows: two round trips); the several-queues claim's outer query,
# which runs the queryset once per queue as a LATERAL subquery of unnest(...) (no
# LATERAL or set-returning FROM in the ORM); the every-queue claim's queue list, a
# recursive CTE (no WITH RECURSIVE in the ORM; its two index probes are one line
# each, and ACTIVE_QUEUES shares it); and the limited claim further down, whose
# per-queue scan reads the CTEs ``allowance`` and ``busy`` and locks rows only after
# ranking them.

# Claims commit asynchronously: set_config(..., true) is local to the statement's
# own transaction (no session state, so pgbouncer-safe) and is still in force
# when it commits, so the claim does not wait for a WAL flush. Safe: a claim lost
# in a server crash leaves the job pending and it runs again (at-least-once), and
# the completion, which commits synchronously, flushes the claim's WAL before it.
ASYNC_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"

# Marks the rows of ``picked`` as claimed. attempts and lease are bumped at claim
# time, so a crash mid-job still counts the attempt and a reclaimed job can be told
# from its zombie. The rows are found with ``id = ANY (ARRAY(SELECT id FROM
# picked))``, a primary-key probe per id whatever the statistics say: joined as
# ``FROM picked WHERE j.id = picked.id``, a table without statistics yet (a bulk
# enqueue into a new table, autovacuum not run) is estimated at a few rows per
# page, and the prepared statement's generic plan became a hash join over a
# sequential scan of the whole table, 13 ms per claim on 50,000 rows
# (tests/test_perf_plans.py pins the plan).
_CLAIM_SET = f"""
UPDATE {JOB} AS j
   SET status = '{JobStatus.RUNNING}',
       attempts = j.attempts + 1,
       lease = j.lease + 1,
       started_at = now(),
       heartbeat_at = now(),
       worker = %(worker)s,
       -- unique_while="pending": a job stops holding its key once it starts
       unique_key = CASE WHEN left(j.unique_key, 8) = 'pending:' THEN NULL
                         ELSE j.unique_key END
  FROM {ASYNC_COMMIT}
 WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING j.id, j.task, j.args, j.kwargs, j.attempts, j.max_attempts, j.lease, j.queue,
          j.priority, j.idempotency_key, j.timeout, j.trace_context
"""


# Claim up to n due jobs of ONE queue: ``picked`` is the compiled queryset
# (``WHERE status = 'pending' AND queue = %(queue)s AND run_at <= now() ORDER BY
# priority DESC, run_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED``), one range scan of
# the claim index that stops after n rows. The CTE is the "optimisation fence": the
# LIMIT applies to the locked set, so the UPDATE can never touch more rows than
# asked for. SKIP LOCKED makes competing workers take different rows instead of
# queueing behind each other.
def _claim_one_queue(picked: str) -> str:
    return f"""
WITH picked AS (
    {picked}
)
{_CLAIM_SET}
"""


# Claim across several queues: each queue is scanned in index order (the compiled
# queryset for queue = qs.name, LATERAL, LIMIT n each) and the best n are taken.
# Rows of the per-queue scans that are not taken stay locked only for this statement.
def _claim_queues(lateral: str) -> str:
    return f"""
WITH picked AS (
    SELECT c.id FROM unnest(%(queues)s::text[]) AS qs(name)
    CROSS JOIN LATERAL ({lateral}) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(n)s
)
{_CLAIM_SET}
"""


# The queues that have pending rows, found with a loose index scan of the claim
# index: one index probe per distinct queue, not a read of every pending row.
# A recursive CTE named qs(name), for WITH RECURSIVE; its last row is NULL.
_PENDING_QUEUES = f"""qs(name) AS (
    (SELECT queue FROM {JOB} WHERE status = '{JobStatus.PENDING}' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM {JOB}
             WHERE status = '{JobStatus.PENDING}' AND queue > qs.name
             ORDER BY queue LIMIT 1)
      FROM qs WHERE qs.name IS NOT NULL
)"""


# The queues with pending rows, on their own: what a worker of every queue claims
# from (flow.FlowState keeps the list: refreshed every POLL_INTERVAL, when a
# NOTIFY names a queue not in it, and after an empty claim without LISTEN). Its
# claims are then JOB_CLAIM_ONE_QUEUE / JOB_CLAIM_QUEUES, which walk the claim
# index once per queue, where JOB_CLAIM_ALL walks it twice (this probe, then the
# LATERAL scan): until VACUUM, each walk steps over the index entries every
# claimed job left behind. Measured on a no-op drain of 50,000 jobs: PostgreSQL
# CPU 26.7 -> 24.9 us per job (docs/explanation/performance.md). Read-only.
PENDING_QUEUES = f"""
WITH RECURSIVE {_PENDING_QUEUES}
SELECT name FROM qs WHERE name IS NOT NULL
"""


# Claim from every queue: the pending queues (loose index scan), then as above.
# sql.claim(queues=None) without a task filter; the worker claims through
# PENDING_QUEUES instead (above).
def _claim_all(lateral: str) -> str:
    return f"""
WITH RECURSIVE {_PENDING_QUEUES}, picked AS (
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
)

# The LIMIT compiled into the queryset (Django writes it as a literal), replaced by
# %(n)s; no real claim asks for this many rows.
_LIMIT_MARK = 1_999_999_999
_PLACEHOLDER = re.compile(r"%%|%s")
_STATUSES = frozenset(s.value for s in JobStatus)

# vendor -> statement name -> text
_claims: dict[str, dict[str, str]] = {}


def claim_statements(connection: Any = None) -> dict[str, str]:
    """The claim statements (``CLAIM_STATEMENTS`` -> text) for ``connection``'s
    database vendor (None, or a plain psycopg connection: the ``PGJOBS["DATABASE"]``
    one's), compiled from ``Job.objects.claimable`` on first use."""
    vendor = getattr(connection, "vendor", None)
    statements = _claims.get(vendor) if vendor is not None else None
    if statements is None:
        if vendor is None:
            from django.db import connections

            from django_pgjobs.conf import get_settings

            connection = connections[get_settings().DATABASE]
            vendor = connection.vendor
        statements = _claims.get(vendor)
        if statements is None:
            statements = _claims[vendor] = compile_claims(connection)
    return statements


def compile_claims(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """Compile the claim statements with ``connection``'s backend (never connecting)."""
    from django.db.models.expressions import RawSQL

    from django_pgjobs.managers import StatementParam
    from django_pgjobs.models import Job

    offline = _offline(connection)

    def picked(queue: Any, known: bool, *columns: str) -> str:
        tasks = StatementParam("tasks") if known else None
        queryset = Job.objects.claimable(queue, tasks=tasks).values(*columns)[:_LIMIT_MARK]
        text, params = queryset.query.get_compiler(connection=offline).as_sql()
        return _named(text, params)

    out: dict[str, str] = {}
    for suffix, known in (("", False), ("_KNOWN", True)):
        lateral = picked(RawSQL("qs.name", ()), known, "id", "priority", "run_at")
        out["JOB_CLAIM_ONE_QUEUE" + suffix] = _claim_one_queue(
            picked(StatementParam("queue"), known, "id")
        )
        out["JOB_CLAIM_QUEUES" + suffix] = _claim_queues(lateral)
        out["JOB_CLAIM_ALL" + suffix] = _claim_all(lateral)
    return {name: out[name] for name in CLAIM_STATEMENTS}


def _named(text: str, params: Sequence[Any]) -> str:
    """Compiled SQL with its positional parameters made named: a ``StatementParam``
    becomes ``%(name)s``, the LIMIT mark ``%(n)s``, and a job status a literal. The
    status must be a literal: only then can the planner match the partial claim index
    (``WHERE status = 'pending'``), also in a prepared statement's generic plan."""
    from django_pgjobs.managers import StatementParam

    values = iter(params)

    def one(match: re.Match[str]) -> str:
        if match.group() == "%%":
            return "%%"
        value = next(values)
        if isinstance(value, StatementParam):
            return f"%({value.name})s"
        if isinstance(value, str) and value in _STATUSES:
            return f"'{value}'"
        raise ValueError(f"the claim queryset has a parameter the claim cannot pass: {value!r}")

    named = _PLACEHOLDER.sub(one, text)
    if next(values, None) is not None or named.count(f"LIMIT {_LIMIT_MARK}") != 1:
        raise ValueError(f"unexpected shape of the compiled claim queryset: {text}")
    return named.replace(f"LIMIT {_LIMIT_MARK}", "LIMIT %(n)s")


def _offline(connection: BaseDatabaseWrapper) -> BaseDatabaseWrapper:
    """A wrapper of ``connection``'s backend that compiles SQL and never connects.
    Django's compiler asks whether a select_for_update() queryset runs inside a
    transaction (asking opens a connection, and the answer is no in autocommit);
    this one answers yes: the compiled text only ever runs inside the claim's
    own statement, which is its transaction."""

    def ensure_connection(self: Any) -> None:
        raise RuntimeError("compiling the claim queryset must not need a connection")

    if not isinstance(connection, BaseDatabaseWrapper):  # django.db.connection, a proxy
        from django.db import connections

        connection = connections[connection.alias]
    backend = type(
        "OfflineCompiler",
        (type(connection),),
        {"ensure_connection": ensure_connection, "get_autocommit": lambda self: False},
    )
    offline: BaseDatabaseWrapper = backend(connection.settings_dict, alias=connection.alias)
    return offline


if TYPE_CHECKING:
    JOB_CLAIM_ONE_QUEUE: str
    JOB_CLAIM_QUEUES: str
    JOB_CLAIM_ALL: str
    JOB_CLAIM_ONE_QUEUE_KNOWN: str
    JOB_CLAIM_QUEUES_KNOWN: str
    JOB_CLAIM_ALL_KNOWN: str
else:

    def __getattr__(name: str) -> str:
        """``sql.JOB_CLAIM_ALL`` and the others read like the module's constants
        (tests, bench, docs): the statements compiled for ``PGJOBS["DATABASE"]``."""
        if name in CLAIM_STATEMENTS:
            return claim_statements()[name]
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# ---------------------------------------------------------------------------
# The limited claim (flow control: pause, max_running, rate, concurrency keys)
# ---------------------------------------------------------------------------

QUEUE = "django_pgjobs_queue"

# Every limited claim first takes this transaction-level advisory lock, in its own
# statement, and then claims in a second statement of the same transaction. That
# serialises limited claims across all workers and hosts, and — because a READ
# COMMITTED statement takes its snapshot when it starts, after the lock was
# granted — the claim counts every job the previous holder claimed (the counts
# below would be stale if lock and count shared one statement). The lock is held
# for the one short claim statement, never while a job runs; the fast path never
# takes it. Released at COMMIT.
FLOW_LOCK_KEY = 0x70676A6F6273  # "pgjobs"
FLOW_LOCK = f"SELECT pg_advisory_xact_lock({FLOW_LOCK_KEY})"

# "N/s" | "N/m" | "N/h" of a queue row q, as (count, seconds). rate_log is a jsonb
# array of epoch seconds (numeric: exact to the microsecond).
_RATE_N = "split_part(q.rate, '/', 1)::int"
_RATE_PERIOD = "CASE split_part(q.rate, '/', 2) WHEN 's' THEN 1 WHEN 'm' THEN 60 ELSE 3600 END"
_NOW_EPOCH = "extract(epoch FROM now())"

# The candidate queues (qs.name) with what each may still start now:
# min(n, max_running - running, rate - starts in the last period). Paused queues
# and queues at a limit drop out. Running counts come from the running index
# (as many rows as jobs in flight). A queue without a row is unlimited.
_FLOW_ALLOWANCE = f"""allowance AS MATERIALIZED (
    SELECT qs.name,
           LEAST(%(n)s,
                 COALESCE(q.max_running - (SELECT count(*) FROM {JOB} r
                                            WHERE r.status = '{JobStatus.RUNNING}'
                                              AND r.queue = qs.name), %(n)s),
                 COALESCE({_RATE_N} - (SELECT count(*)
                                         FROM jsonb_array_elements_text(q.rate_log) AS t(at)
                                        WHERE t.at::numeric > {_NOW_EPOCH} - {_RATE_PERIOD}),
                          %(n)s)
           ) AS allow
      FROM qs LEFT JOIN {QUEUE} q ON q.name = qs.name
     WHERE qs.name IS NOT NULL AND NOT COALESCE(q.paused, false)
), busy AS MATERIALIZED (
    -- running jobs per concurrency key (running index: jobs in flight only)
    SELECT concurrency_key AS key, count(*) AS running FROM {JOB}
     WHERE status = '{JobStatus.RUNNING}' AND concurrency_key IS NOT NULL
     GROUP BY concurrency_key
)"""

# Per allowed queue, the first due rows in claim-index order whose key (if any)
# is below its limit: rows of a blocked key are skipped by the scan, so they never
# stall the rows behind them. Over-fetches (%(scan)s rows) so that several rows of
# one key cannot crowd out the others; ranking then keeps at most (limit -
# running) rows per key and `allow` rows per queue, and the best n overall. The
# rows are locked only then, by id (SKIP LOCKED; status re-checked on the locked
# row version), for _CLAIM_SET.
_FLOW_PICK = f"""cand AS (
    SELECT c.*, a.allow FROM allowance a
    CROSS JOIN LATERAL (
        SELECT j.id, j.queue, j.priority, j.run_at, j.concurrency_key, j.concurrency_limit
          FROM {JOB} j
         WHERE j.status = '{JobStatus.PENDING}' AND j.queue = a.name AND j.run_at <= now()
           AND array_position(%(tasks)s::text[], j.task::text) IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM busy b
                            WHERE b.key = j.concurrency_key
                              AND b.running >= j.concurrency_limit)
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT %(scan)s
    ) AS c
    WHERE a.allow > 0
), keyed AS (
    SELECT cand.*,
           row_number() OVER (PARTITION BY cand.concurrency_key
                              ORDER BY cand.priority DESC, cand.run_at, cand.id) AS key_rank,
           cand.concurrency_limit - COALESCE(b.running, 0) AS key_free
      FROM cand LEFT JOIN busy b ON b.key = cand.concurrency_key
), ranked AS (
    SELECT keyed.*,
           row_number() OVER (PARTITION BY keyed.queue
                              ORDER BY keyed.priority DESC, keyed.run_at, keyed.id) AS queue_rank
      FROM keyed WHERE keyed.concurrency_key IS NULL OR keyed.key_rank <= keyed.key_free
), chosen AS (
    SELECT id FROM ranked WHERE queue_rank <= allow
     ORDER BY priority DESC, run_at, id
     LIMIT %(n)s
), picked AS (
    SELECT j.id FROM {JOB} j JOIN chosen ON chosen.id = j.id
     WHERE j.status = '{JobStatus.PENDING}'
       FOR UPDATE OF j SKIP LOCKED
), claimed AS ({_CLAIM_SET}), logged AS (
    -- the sliding window of the rate limit: this claim's starts, and the starts
    -- of the last period. now() is the transaction's start, which can precede the
    -- lock grant (and a claim that committed before): counting every entry newer
    -- than now() - period, even "future" ones, keeps any window of one period at
    -- most N; entries are kept one second longer than a period for such a claim.
    UPDATE {QUEUE} q
       SET rate_log = (SELECT COALESCE(jsonb_agg(w.at ORDER BY w.at), '[]'::jsonb) FROM (
                           SELECT t.at::numeric AS at
                             FROM jsonb_array_elements_text(q.rate_log) AS t(at)
                            WHERE t.at::numeric > {_NOW_EPOCH} - {_RATE_PERIOD} - 1
                           UNION ALL
                           SELECT {_NOW_EPOCH} FROM generate_series(1, s.started)) AS w)
      FROM (SELECT queue, count(*)::int AS started FROM claimed GROUP BY queue) s
     WHERE q.name = s.queue AND q.rate IS NOT NULL
)
SELECT * FROM claimed"""

# Limited claim from a list of queues (after FLOW_LOCK, same transaction).
JOB_CLAIM_LIMITED_QUEUES = f"""
WITH qs(name) AS (SELECT unnest(%(queues)s::text[])),
{_FLOW_ALLOWANCE},
{_FLOW_PICK}
"""

# Limited claim from every queue with pending rows (loose index scan, as above).
JOB_CLAIM_LIMITED_ALL = f"""
WITH RECURSIVE {_PENDING_QUEUES},
{_FLOW_ALLOWANCE},
{_FLOW_PICK}
"""

# The flow-control state workers cache (refreshed every POLL_INTERVAL and on a
# queue-change NOTIFY): only rows that limit something. No locks.
QUEUE_LIMITS = f"""
SELECT name, paused, max_running, rate FROM {QUEUE}
 WHERE paused OR max_running IS NOT NULL OR rate IS NOT NULL
"""

# ---------------------------------------------------------------------------
# Fenced writes about claimed jobs
# ---------------------------------------------------------------------------


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
# history): measured 57-84 ms per 64-row completion batch on a 200,000-job drain,
# 2,000 jobs/s instead of 10,000. tests/test_perf_plans.py pins the plans.
def by_id_is(*statuses: str, column: str = "status") -> str:
    if len(statuses) == 1:
        return f"{column} = '{statuses[0]}' COLLATE \"C\""
    listed = ", ".join(f"'{status}'" for status in statuses)
    return f'{column} COLLATE "C" IN ({listed})'


def _lock_ours(source: str) -> str:
    """The running rows of ``source`` (id, lease) that are still ours, locked in id
    order: the shared first step of the heartbeat and the redo completion, so the
    two can never wait on each other in a cycle."""
    return f"""SELECT j.id FROM {JOB} j JOIN {source} ON j.id = {source}.id AND j.lease = {source}.lease
     WHERE {by_id_is(JobStatus.RUNNING, column="j.status")}
     ORDER BY j.id
       FOR NO KEY UPDATE OF j"""


# Refresh the heartbeat of all of a worker's in-flight jobs in one statement.
# Rows are locked in id order (see module docstring). Returns the ids whose lease
# is no longer ours: reclaimed, cancelled or retried by someone else.
JOB_HEARTBEAT = f"""
WITH f AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[]) AS f(id, lease)
), mine AS (
    {_lock_ours("f")}
), touched AS (
    -- asynchronous commit, as for claims: a lost heartbeat only ages the row
    UPDATE {JOB} AS j SET heartbeat_at = now() FROM mine, {ASYNC_COMMIT}
     WHERE j.id = mine.id RETURNING j.id
)
SELECT f.id FROM f LEFT JOIN {JOB} j ON j.id = f.id
 WHERE j.id IS NULL OR j.lease <> f.lease
"""

# Complete a batch of jobs and store their results in the same statement (so in
# the same transaction); fenced by lease and status. A result row is written when
# there is a value or an idempotency key to protect. JobResult has no FK to the
# job, so this insert takes no lock on job rows.
#
# Two forms. JOB_COMPLETE_MANY is the completer's first try of a batch, the hot
# one: a plain UPDATE through the primary key, rows locked as the nested loop over
# ``d`` meets them, so in the id order complete_many sorts them in — the order the
# heartbeat locks in, so the two do not wait on each other in a cycle (were a plan
# ever to lock otherwise, PostgreSQL would break the deadlock with an error, and
# the completer redoes the batch with the redo form). It cannot meet a write of
# its own that committed earlier, so it does not look for one. Compared with the
# redo form it saves a row lock (a WAL record per row) and a second probe per row.
_COMPLETE_ITEMS = """d AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[], %(values)s::jsonb[])
        AS d(id, lease, value)
)"""

# Both forms end the same: ``done`` returns (id, idempotency_key, value) of the rows
# completed, and their results are stored.
_STORE_RESULTS = f"""stored AS (
    INSERT INTO {RESULT} (job_id, idempotency_key, value, created_at)
    SELECT done.id, done.idempotency_key, done.value, now()
      FROM done
     WHERE done.value IS NOT NULL OR done.idempotency_key IS NOT NULL
    ON CONFLICT DO NOTHING
)"""

JOB_COMPLETE_MANY = f"""
WITH {_COMPLETE_ITEMS}, done AS (
    UPDATE {JOB} AS j SET status = '{JobStatus.COMPLETED}', finished_at = now()
      FROM d
     WHERE j.id = d.id AND j.lease = d.lease
       AND {by_id_is(JobStatus.RUNNING, column="j.status")}
    RETURNING j.id, j.idempotency_key, d.value
), {_STORE_RESULTS}
SELECT id FROM done
"""

# The redo form, for every other caller (a batch retried after an error, one row
# at a time, an atomic job's own transaction, run_jobs): locks its rows in id order
# first (shared with the heartbeat) and also answers the rows an earlier, committed
# run of this very write completed.
JOB_COMPLETE_MANY_REDO = f"""
WITH {_COMPLETE_ITEMS}, mine AS (
    {_lock_ours("d")}
), done AS (
    UPDATE {JOB} AS j SET status = '{JobStatus.COMPLETED}', finished_at = now()
      FROM mine JOIN d ON d.id = mine.id WHERE j.id = mine.id
    RETURNING j.id, j.idempotency_key, d.value
), {_STORE_RESULTS}
SELECT id FROM done
UNION ALL
-- Already completed under OUR lease: an earlier run of this very write committed
-- (its reply was lost, or the batch was retried after an error). The statement's
-- snapshot predates ``done``, so a row is never counted twice.
SELECT j.id FROM {JOB} j JOIN d ON j.id = d.id AND j.lease = d.lease
 WHERE {by_id_is(JobStatus.COMPLETED, column="j.status")}
"""


def keep_newest(array: str) -> str:
    """SQL for the jsonb array ``array`` cut to its ``%(keep)s`` newest entries
    (``PGJOBS["MAX_ERRORS_KEPT"]``): the error history of a job stays bounded
    however often it fails, is reclaimed or retried."""
    return (
        f"jsonb_path_query_array({array}, 'lax $[last - $n + 1 to last]', "
        "jsonb_build_object('n', %(keep)s::int))"
    )


# Recognising our own earlier committed write (its reply was lost, the write is
# redone): every error entry a worker writes is unique (its worker id and an
# ``at`` time taken client-side with microseconds), so "the row's errors contain
# our entry" means "this very write committed", even after the job was claimed
# again by another worker (the lease moved on). Matched by primary key and
# containment, so it stays cheap. ``%(mark)s`` is NULL for an entry without
# ``at``: then only the same-lease check recognises it (``by_lease``; a write that
# bumps the lease can never match its old lease again, so it has the entry only).
# Corner case: entries are trimmed to the MAX_ERRORS_KEPT newest; ours is the
# newest when written, so it is only lost if that many later failures were
# recorded before the redo, and then the redo is reported as fenced (it changes
# nothing either way).
def _ours_already(statuses: str, *, by_lease: bool = True) -> str:
    entry = "errors @> %(mark)s::jsonb"
    if not by_lease:
        return entry
    return f"""(lease = %(lease)s AND status IN ({statuses}) AND last_error = %(last_error)s)
        OR {entry}"""


# A failed attempt: back to pending after the backoff delay, or dead. Fenced by the
# lease we claimed; returns the status our write gave the row. Guarded by
# attempts: a row whose attempts are used up is dead-lettered instead, whatever
# the caller decided, so no row is ever pending with attempts = max_attempts (its
# next claim would violate attempts_in_bounds and fail the whole claim statement).
# The second SELECT recognises our own earlier committed write (see _ours_already):
# a redone write reports that status once more instead of "fenced". The
# statement's snapshot predates ``upd``, so a row is never returned twice.
#
# timed_out=True: give up on a run that exceeded its timeout. The lease is also
# bumped (anything the abandoned run writes later is fenced), and %(retry)s says
# whether the job may be retried at all; the lease bump means a redo of this write
# can only recognise its committed write by its error entry.
def _failed_attempt(*, timed_out: bool) -> str:
    retry = f"attempts < max_attempts{' AND %(retry)s' if timed_out else ''}"
    redo_retry = f"%(attempt)s::int < max_attempts{' AND %(retry)s' if timed_out else ''}"
    return f"""
WITH upd AS (
    UPDATE {JOB}
       SET {"lease = lease + 1, " if timed_out else ""}status = CASE WHEN {retry} THEN '{JobStatus.PENDING}' ELSE '{JobStatus.DEAD}' END,
           finished_at = CASE WHEN {retry} THEN NULL ELSE now() END,
           run_at = now() + make_interval(secs => %(delay)s),
           errors = {keep_newest("errors || %(error)s::jsonb")},
           last_error = %(last_error)s
     WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(JobStatus.RUNNING)}
    RETURNING status
)
SELECT status FROM upd
UNION ALL
SELECT CASE WHEN lease = %(lease)s AND status <> '{JobStatus.RUNNING}' THEN status
            WHEN {redo_retry} THEN '{JobStatus.PENDING}'
            ELSE '{JobStatus.DEAD}' END
  FROM {JOB}
 WHERE id = %(id)s
   AND ({_ours_already(f"'{JobStatus.PENDING}', '{JobStatus.DEAD}'", by_lease=not timed_out)})
"""


JOB_RETRY = _failed_attempt(timed_out=False)
JOB_TIMED_OUT = _failed_attempt(timed_out=True)

# A failed attempt with none left (or discard_on / unknown task): dead letter.
# Same recognition of our own earlier committed write as JOB_RETRY.
JOB_DEAD = f"""
WITH upd AS (
    UPDATE {JOB}
       SET status = '{JobStatus.DEAD}',
           finished_at = now(),
           errors = {keep_newest("errors || %(error)s::jsonb")},
           last_error = %(last_error)s
     WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(JobStatus.RUNNING)}
    RETURNING id
)
SELECT id FROM upd
UNION ALL
SELECT id FROM {JOB}
 WHERE id = %(id)s AND ({_ours_already(f"'{JobStatus.DEAD}'")})
"""

# A claim statement failed with a data error (a CHECK violation): the only row
# state that makes a claim fail is a pending row whose attempts are used up
# (written by an older version, or by hand). Dead-letter those rows, each with a
# clear error, so the queue moves again. SKIP LOCKED: never waits on a worker.
JOB_DEAD_EXHAUSTED = f"""
WITH bad AS (
    SELECT id FROM {JOB}
     WHERE status = '{JobStatus.PENDING}' AND attempts >= max_attempts
     ORDER BY id
     LIMIT 1000
       FOR UPDATE SKIP LOCKED
)
UPDATE {JOB} AS j
   SET status = '{JobStatus.DEAD}', finished_at = now(), lease = j.lease + 1,
       errors = j.errors || jsonb_build_array(jsonb_build_object(
           'attempt', j.attempts, 'at', now(), 'type', 'django_pgjobs.exceptions.PgJobsError',
           'message', %(message)s::text, 'traceback', NULL, 'worker', %(worker)s::text)),
       last_error = %(message)s
  FROM bad
 WHERE j.id = bad.id
RETURNING j.id, j.task
"""

# Graceful shutdown: hand an unfinished job back without counting the attempt.
JOB_RELEASE = f"""
UPDATE {JOB}
   SET status = '{JobStatus.PENDING}', attempts = attempts - 1, run_at = now()
 WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(JobStatus.RUNNING)}
RETURNING id
"""

# A stored result for an idempotency key: the job already ran to completion once.
RESULT_BY_KEY = f"SELECT value FROM {RESULT} WHERE idempotency_key = %s"

# ---------------------------------------------------------------------------
# Reaper, admin actions
# ---------------------------------------------------------------------------

_ERROR_ENTRY = """jsonb_build_array(jsonb_build_object(
    'attempt', j.attempts, 'at', now(), 'type', %(type)s::text, 'message', %(message)s::text,
    'traceback', NULL, 'worker', j.worker, 'refunded', stale.refund))"""

# How many times a job's worker was lost while running it with the attempt given
# back (entries marked "refunded" by the reaper; an admin retry clears the marks).
_REFUNDED = "jsonb_array_length(jsonb_path_query_array(errors, 'lax $[*] ? (@.refunded == true)'))"

# Reclaim running jobs whose heartbeat is stale. SKIP LOCKED: reapers on many
# hosts split the stale rows between them and never wait on a worker that is
# completing the same row right now; the lease bump fences the lost worker.
#
# A lost worker is not its jobs' fault, except for one of them perhaps (os._exit,
# a segfault, an OOM kill takes every neighbour in the process along): the attempt
# is given back (attempts - 1, back to pending) unless the job has already had it
# given back max_attempts times (bounded by the kept history), and then it is
# dead-lettered: a real crasher still ends, its neighbours lose nothing.
JOB_REAP_STALE = f"""
WITH stale AS (
    SELECT id, {_REFUNDED} < least(max_attempts, %(keep)s) AS refund FROM {JOB}
     WHERE status = '{JobStatus.RUNNING}'
       AND heartbeat_at < now() - make_interval(secs => %(stale_after)s)
     ORDER BY heartbeat_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
)
UPDATE {JOB} AS j
   SET lease = j.lease + 1,
       status = CASE WHEN stale.refund THEN '{JobStatus.PENDING}' ELSE '{JobStatus.DEAD}' END,
       attempts = CASE WHEN stale.refund THEN j.attempts - 1 ELSE j.attempts END,
       finished_at = CASE WHEN stale.refund THEN NULL ELSE now() END,
       run_at = now(),
       errors = {keep_newest(f"j.errors || {_ERROR_ENTRY}")},
       last_error = %(message)s || CASE WHEN stale.refund THEN '; the attempt was not counted'
                                        ELSE '; dead-lettered: its workers were lost too often'
                                   END
  FROM stale
 WHERE j.id = stale.id
RETURNING j.id, j.task, j.status, j.attempts, j.worker
"""

# Cancel pending or running jobs; the lease bump rejects an in-flight result.
JOB_CANCEL = f"""
WITH mine AS (
    SELECT id FROM {JOB}
     WHERE id = ANY(%(ids)s::bigint[])
       AND {by_id_is(JobStatus.PENDING, JobStatus.RUNNING)}
     ORDER BY id
       FOR NO KEY UPDATE
)
UPDATE {JOB} AS j
   SET status = '{JobStatus.CANCELLED}', lease = j.lease + 1, finished_at = now()
  FROM mine WHERE j.id = mine.id
RETURNING j.id
"""

# The error history with the reaper's "refunded" marks cleared (see JOB_REAP_STALE).
_FORGIVEN = """(SELECT COALESCE(jsonb_agg(CASE WHEN e ? 'refunded' THEN e || '{"refunded": false}'
                                           ELSE e END ORDER BY i), '[]'::jsonb)
          FROM jsonb_array_elements(CASE WHEN jsonb_typeof(j.errors) = 'array'
                                         THEN j.errors ELSE '[]'::jsonb END)
               WITH ORDINALITY AS x(e, i))"""

# Retry now: dead, cancelled, or stuck running (stale heartbeat) -> pending, attempts
# reset, lease bumped so a stuck job's zombie is fenced; the error history stays.
#
# unique_while (SPEC 11): a dead or cancelled job that still carries a unique key
# must not take it back while another job holds it (pending or running), nor may
# two jobs of this statement take the same key. Such a job is skipped, like a
# second enqueue of the key: one row per skipped job, with the id of the job that
# holds (or in this call takes) the key; retried jobs come back with holder NULL.
# A stuck running job already holds its own key, so it is never skipped.
# Race-free with RETRY_KEY_LOCK first, in its own statement of the same transaction:
# two retries of the same key are serialised, and the second one's statement, whose
# snapshot is taken after the lock is granted, sees the first one's committed row.
JOB_RETRY_NOW = f"""
WITH mine AS (
    SELECT id, status, unique_key FROM {JOB}
     WHERE id = ANY(%(ids)s::bigint[])
       AND (status IN ('{JobStatus.DEAD}', '{JobStatus.CANCELLED}')
            OR (status = '{JobStatus.RUNNING}'
                AND heartbeat_at < now() - make_interval(secs => %(stale_after)s)))
     ORDER BY id
       FOR NO KEY UPDATE
), keyed AS (
    SELECT m.id,
           (SELECT h.id FROM {JOB} h
             WHERE h.unique_key = m.unique_key
               AND h.status IN ('{JobStatus.PENDING}', '{JobStatus.RUNNING}')
             LIMIT 1) AS holder,
           min(m.id) OVER (PARTITION BY m.unique_key) AS first
      FROM mine m
     WHERE m.unique_key IS NOT NULL AND m.status <> '{JobStatus.RUNNING}'
), skipped AS (
    SELECT id, COALESCE(holder, first) AS holder FROM keyed
     WHERE holder IS NOT NULL OR id <> first
), retried AS (
    UPDATE {JOB} AS j
       SET status = '{JobStatus.PENDING}', lease = j.lease + 1, attempts = 0,
           run_at = now(), finished_at = NULL,
           -- the history stays (newest entries only); a fresh start forgives lost workers
           errors = {keep_newest(_FORGIVEN)}
      FROM mine
     WHERE j.id = mine.id AND mine.id NOT IN (SELECT id FROM skipped)
    RETURNING j.id
)
SELECT id, NULL::bigint FROM retried
UNION ALL
SELECT id, holder FROM skipped
"""

# Serialise retries that could take the same unique_while key (see JOB_RETRY_NOW):
# one transaction-level advisory lock per key, in one order (no deadlock between two
# retries); nothing to lock, and no cost, for jobs without a key. Released at COMMIT.
RETRY_LOCK_SPACE = 0x706A6B79  # "pjky": the first key of the two-int advisory locks
RETRY_KEY_LOCK = f"""
SELECT pg_advisory_xact_lock({RETRY_LOCK_SPACE}, k.h)
  FROM (SELECT DISTINCT hashtext(unique_key) AS h FROM {JOB}
         WHERE id = ANY(%(ids)s::bigint[]) AND unique_key IS NOT NULL
           AND status IN ('{JobStatus.DEAD}', '{JobStatus.CANCELLED}')
         ORDER BY 1) AS k
"""

# ---------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------

WORKER_UPSERT = f"""
INSERT INTO {WORKER} (id, host, pid, queues, concurrency, started_at, last_seen, tasks)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, now(), now(),
        %(tasks)s::jsonb)
ON CONFLICT (id) DO UPDATE SET last_seen = now()
"""

WORKER_DELETE = f"DELETE FROM {WORKER} WHERE id = %s"

# Forget workers not seen for a long time (crashed without saying goodbye).
WORKER_FORGET_STALE = f"""
DELETE FROM {WORKER} WHERE last_seen < now() - make_interval(secs => %(older_than)s)
"""


@dataclass(frozen=True)
class Claimed:
    """A claimed job as the worker sees it (no model instance on the hot path)."""

    id: int
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    max_attempts: int
    lease: int
    queue: str
    priority: int
    idempotency_key: str | None
    timeout: float | None = None
    trace_context: dict[str, str] | None = None  # W3C trace context stored at enqueue


class Undecodable(str):
    """Stands in for stored args/kwargs that cannot be decoded (a number of more
    than 4,300 digits, nesting deeper than the interpreter's recursion limit): the
    executor dead-letters that job alone, with this text as the reason."""


class _PreparedCursor:
    """A psycopg cursor whose ``execute`` sends hot statements as named prepared
    statements (parsed and planned once per connection), whatever Django's own
    ``server_side_binding`` says. Falls back to unprepared execution for good when
    the server says a prepared statement is missing (a transaction pooler)."""

    __slots__ = ("cursor", "wrapper")

    def __init__(self, cursor: Any, wrapper: BaseDatabaseWrapper):
        self.cursor = cursor
        self.wrapper = wrapper

    def execute(self, statement: str, params: Any = None) -> Any:
        import psycopg.errors

        try:
            return self.cursor.execute(statement, params, prepare=True)
        except (
            psycopg.errors.InvalidSqlStatementName,
            psycopg.errors.DuplicatePreparedStatement,
        ) as exc:
            _disable_prepare(
                f"the server lost a prepared statement ({exc}); probably a transaction pooler"
            )
            if not self.wrapper.get_autocommit():
                raise
            return self.cursor.execute(statement, params, prepare=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


_prepare_disabled = False


def _disable_prepare(reason: str) -> None:
    global _prepare_disabled
    if not _prepare_disabled:
        import logging

        logging.getLogger("django_pgjobs").warning(
            "prepared statements switched off for this process: %s "
            "(set PGJOBS['PREPARE'] = False to say so up front)",
            reason,
        )
    _prepare_disabled = True


def _may_prepare(connection: BaseDatabaseWrapper, raw: Any) -> bool:
    """PGJOBS["PREPARE"]: True, False, or "auto": prepare unless the server we talk
    to listens on another port than the one we connected to (a pooler such as
    pgbouncer in front of it; pgbouncer < 1.21 in transaction mode cannot keep
    prepared statements). Checked once per connection."""
    from django_pgjobs.conf import get_settings

    setting = get_settings().PREPARE
    if setting is False or (setting == "auto" and _prepare_disabled):
        return False
    if setting == "auto":
        options = connection.settings_dict.get("OPTIONS") or {}
        if "prepare_threshold" in options and options["prepare_threshold"] is None:
            return False  # the project switched psycopg's prepared statements off itself
        with raw.cursor() as cursor:
            cursor.execute("SELECT current_setting('port')")
            row = cursor.fetchone()
        try:
            if row is None or int(row[0]) != int(raw.info.port):
                return False
        except (TypeError, ValueError):
            return False
    if raw.prepare_threshold is None:
        # Django's client-side binding leaves psycopg's preparing off; turn it on
        # for our explicit prepare=True only (no count ever reaches the threshold).
        raw.prepare_threshold = 2**31 - 1
    return True


@contextmanager
def hot_cursor(connection: Connection) -> Iterator[Any]:
    """A cursor for the hot path (enqueue, claim, complete) that is reused.

    Django's ``connection.cursor()`` builds a new psycopg cursor (with a copy of the
    adapters map) and a wrapper per call: ~45 us, a seventh of a single enqueue.
    This keeps Django's semantics that matter here — the connection is opened on
    demand, a broken atomic block is refused, and errors come out as django.db
    errors — and falls back to Django's cursor when queries are being logged
    (DEBUG, assertNumQueries) or ``connection.execute_wrapper`` wrappers are
    installed, so they still see every statement.

    Where ``PGJOBS["PREPARE"]`` allows, statements run as server-side prepared
    statements (in autocommit only under "auto": behind a pooler a prepared
    statement may vanish, and only outside a transaction can the statement be
    repeated unprepared).
    """
    if (
        isinstance(connection, psycopg.Connection)
        or connection.queries_logged
        or connection.execute_wrappers
    ):
        # A plain psycopg connection (the fault suite drives these functions with its
        # own), queries are logged, or wrappers are installed.
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    cached = getattr(connection, "_pgjobs_hot_cursor", None)
    if cached is None or cached[0] is not raw or cached[1].closed:
        with connection.wrap_database_errors:
            prepare = _may_prepare(connection, raw)
        # A server-side-binding cursor (Django's default is client-side binding,
        # which cannot prepare); it shares the connection's adapters.
        plain = psycopg.Cursor(raw) if prepare else raw.cursor()
        cached = (raw, plain, _PreparedCursor(plain, connection) if prepare else None)
        connection._pgjobs_hot_cursor = cached  # type: ignore[attr-defined]  # our cache on Django's object
    prepared = cached[2]
    use = (
        cached[1]
        if prepared is None or (_prepare_disabled or not connection.get_autocommit())
        else prepared
    )
    with connection.wrap_database_errors:
        yield use


def claim(
    connection: Connection,
    *,
    worker: str,
    queues: Sequence[str] | None,
    n: int,
    tasks: Sequence[str] | None = None,
    limited: bool = False,
) -> list[Claimed]:
    """Claim up to ``n`` due jobs (``queues=None``: every queue) in one round trip:
    the rows of ``Job.objects.claimable(queues, tasks=tasks)``, marked running.

    ``tasks``: claim only jobs of these tasks (the worker's registry; None: any).
    ``limited``: some queue in scope is paused or limited, or a known task has a
    concurrency key (see ``flow.FlowState``): take the serialised limited claim.
    """
    params: dict[str, Any] = {"worker": worker, "n": n}
    if limited:
        if isinstance(connection, psycopg.Connection):
            raise TypeError("the limited claim runs on Django's connection only")
        return _claim_limited(connection, params, queues, tasks)
    statements = claim_statements(connection)
    known = tasks is not None
    if known:
        params["tasks"] = task_array(tuple(tasks or ()))
    if queues is None:
        statement = statements["JOB_CLAIM_ALL_KNOWN" if known else "JOB_CLAIM_ALL"]
    elif len(queues) == 1:
        statement = statements["JOB_CLAIM_ONE_QUEUE_KNOWN" if known else "JOB_CLAIM_ONE_QUEUE"]
        params["queue"] = queues[0]
    else:
        statement = statements["JOB_CLAIM_QUEUES_KNOWN" if known else "JOB_CLAIM_QUEUES"]
        params["queues"] = list(queues)
    with hot_cursor(connection) as cursor:
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    return _claimed(rows)


def pending_queues(connection: Connection) -> list[str]:
    """The names of the queues that have pending jobs (due or not), sorted."""
    with hot_cursor(connection) as cursor:
        cursor.execute(PENDING_QUEUES)
        return [row[0] for row in cursor.fetchall()]


@functools.lru_cache(maxsize=64)
def task_array(tasks: tuple[str, ...]) -> str:
    """The ``text[]`` literal of a worker's task names, built once: adapting a list of
    a hundred strings on every claim cost more than the filter itself."""
    quoted = ('"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"' for t in tasks)
    return "{" + ",".join(quoted) + "}"


def _claim_limited(
    connection: BaseDatabaseWrapper,
    params: dict[str, Any],
    queues: Sequence[str] | None,
    tasks: Sequence[str] | None,
) -> list[Claimed]:
    """FLOW_LOCK, then the limited claim, in one short transaction (see FLOW_LOCK)."""
    from django.db import transaction

    from django_pgjobs import registry

    params["tasks"] = task_array(
        tuple(tasks) if tasks is not None else tuple(d.name for d in registry.all_definitions())
    )
    params["scan"] = max(4 * params["n"], 64)
    if queues is None:
        statement = JOB_CLAIM_LIMITED_ALL
    else:
        statement = JOB_CLAIM_LIMITED_QUEUES
        params["queues"] = list(queues)
    with transaction.atomic(using=connection.alias, savepoint=False), connection.cursor() as cursor:
        cursor.execute(FLOW_LOCK)
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    return _claimed(rows)


def _claimed(rows: Sequence[Sequence[Any]]) -> list[Claimed]:
    # Django's psycopg setup loads jsonb as text (it decodes JSON in the ORM).
    # Decoded per row: one undecodable row fails its own job, not the batch.
    return [
        Claimed(
            r[0],
            r[1],
            _args(r[2]),
            _args(r[3]),
            r[4],
            r[5],
            r[6],
            r[7],
            r[8],
            r[9],
            r[10],
            _trace_context(r[11]),
        )
        for r in rows
    ]


def _args(value: Any) -> Any:
    try:
        return _json(value)
    except BaseException as exc:  # noqa: BLE001 - RecursionError, ValueError (digit limit)
        return Undecodable(f"{type(exc).__name__}: {str(exc)[:300]}")


def _trace_context(value: Any) -> dict[str, str] | None:
    """The stored W3C trace context; None when absent (or not a JSON object: a
    trace is never worth failing a job for)."""
    if value is None:
        return None
    try:
        decoded = _json(value)
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


def _json(value: Any) -> Any:
    # Empty args/kwargs are the common case; skipping json.loads for them was
    # measurable in a claim-loop profile (two decodes per claimed job).
    if value == "[]":
        return []
    if value == "{}":
        return {}
    return json.loads(value) if isinstance(value, str | bytes) else value


def encode_result(value: Any) -> str | None:
    """The JSON text stored for a return value (None: nothing to store). Raises
    ValueError/RecursionError for values json cannot encode: callers run it in the
    job's own thread so only that job fails."""
    return None if value is None else json.dumps(value, allow_nan=False)


class Encoded(str):
    """A return value already encoded with ``encode_result`` (by the job thread)."""


def complete_many(
    connection: Connection, items: Sequence[tuple[int, int, Any]], *, redo: bool = True
) -> set[int]:
    """Complete ``(id, lease, return value)`` items; returns the ids that were still ours
    (with ``redo``, including those an earlier, committed run of the same write
    completed). ``redo=False`` only for a first try that cannot have run before.
    Values of type ``Encoded`` are stored as they are."""
    items = sorted(items, key=lambda i: i[0])  # lock order: by id
    ids = [i[0] for i in items]
    leases = [i[1] for i in items]
    values = [i[2] if isinstance(i[2], Encoded) else encode_result(i[2]) for i in items]
    statement = JOB_COMPLETE_MANY_REDO if redo else JOB_COMPLETE_MANY
    with hot_cursor(connection) as cursor:
        cursor.execute(statement, {"ids": ids, "leases": leases, "values": values})
        return {row[0] for row in cursor.fetchall()}


def heartbeat(connection: Connection, items: Sequence[tuple[int, int]]) -> set[int]:
    """Touch ``(id, lease)`` items; returns the ids whose lease is no longer ours."""
    if not items:
        return set()
    with hot_cursor(connection) as cursor:
        cursor.execute(
            JOB_HEARTBEAT, {"ids": [i[0] for i in items], "leases": [i[1] for i in items]}
        )
        return {row[0] for row in cursor.fetchall()}


def _fenced(connection: Connection, statement: str, params: dict[str, Any]) -> bool:
    with hot_cursor(connection) as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone() is not None


def retry(
    connection: Connection, *, id: int, lease: int, delay: float, error: dict[str, Any]
) -> bool:
    return retry_status(connection, id=id, lease=lease, delay=delay, error=error) is not None


def retry_status(
    connection: Connection, *, id: int, lease: int, delay: float, error: dict[str, Any]
) -> str | None:
    """Write a retry; the status it gave the row ("pending", or "dead" when the
    attempts guard dead-lettered it), or None when the lease was no longer ours."""
    with hot_cursor(connection) as cursor:
        cursor.execute(
            JOB_RETRY,
            {"id": id, "lease": lease, "delay": delay, "keep": _keep(), **_error_params(error)},
        )
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def dead(connection: Connection, *, id: int, lease: int, error: dict[str, Any]) -> bool:
    return _fenced(
        connection, JOB_DEAD, {"id": id, "lease": lease, "keep": _keep(), **_error_params(error)}
    )


def _error_params(error: dict[str, Any]) -> dict[str, Any]:
    """The error entry to append, and the parts that make it unique (``mark``, for
    recognising our own earlier committed write; NULL when it has no ``at``)."""
    mark = None
    if error.get("at") is not None:
        mark = json.dumps([{k: error.get(k) for k in ("attempt", "at", "worker")}])
    attempt = error.get("attempt")
    return {
        "error": json.dumps([error]),
        "last_error": _last_error(error),
        "mark": mark,
        "attempt": attempt if isinstance(attempt, int) else None,
    }


def release(connection: Connection, *, id: int, lease: int) -> bool:
    return _fenced(connection, JOB_RELEASE, {"id": id, "lease": lease})


def dead_exhausted(connection: BaseDatabaseWrapper, *, worker: str) -> list[tuple[int, str]]:
    """Dead-letter pending rows whose attempts are used up (they fail every claim)."""
    message = (
        "pending with its attempts used up, which would fail every claim of its "
        "queue; dead-lettered"
    )
    with connection.cursor() as cursor:
        cursor.execute(JOB_DEAD_EXHAUSTED, {"message": message, "worker": worker})
        return [(r[0], r[1]) for r in cursor.fetchall()]


def timed_out(
    connection: BaseDatabaseWrapper,
    *,
    id: int,
    lease: int,
    retry: bool,
    delay: float,
    error: dict[str, Any],
) -> str | None:
    """Give up on a run past its timeout (lease bumped); the new status, or None if
    the lease was no longer ours."""
    with hot_cursor(connection) as cursor:
        cursor.execute(
            JOB_TIMED_OUT,
            {
                "id": id,
                "lease": lease,
                "retry": retry,
                "delay": delay,
                "keep": _keep(),
                **_error_params(error),
            },
        )
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def result_for_key(connection: BaseDatabaseWrapper, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of the stored result for an idempotency key."""
    with connection.cursor() as cursor:
        cursor.execute(RESULT_BY_KEY, [key])
        row = cursor.fetchone()
    return (False, None) if row is None else (True, _json(row[0]))


def reap(
    connection: Connection, *, stale_after: float, batch: int = 500
) -> list[tuple[int, str, str, int, str | None]]:
    """Reclaim one batch of stale running jobs; returns (id, task, new status, attempts, worker)."""
    from django_pgjobs.exceptions import WorkerLost

    message = (
        f"worker lost: no heartbeat for more than {stale_after:g}s; "
        "the job was reclaimed (it may have been running on a worker that was only slow)"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            JOB_REAP_STALE,
            {
                "stale_after": stale_after,
                "batch": batch,
                "message": message,
                "type": f"{WorkerLost.__module__}.{WorkerLost.__qualname__}",
                "keep": _keep(),
            },
        )
        return [tuple(r) for r in cursor.fetchall()]


def cancel(connection: Connection, ids: Sequence[int]) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(JOB_CANCEL, {"ids": list(ids)})
        return {r[0] for r in cursor.fetchall()}


def _atomic(connection: Connection) -> Any:
    """A transaction (a savepoint when nested) on Django's connection, or on a plain
    psycopg connection (the fault suite drives these functions with its own)."""
    if isinstance(connection, psycopg.Connection):
        return connection.transaction()
    from django.db import transaction

    return transaction.atomic(using=connection.alias)


@dataclass(frozen=True)
class Retried:
    """What one retry statement did: the ids it put back to pending, and the ids it
    skipped because their unique_while key is held, each with the holder's id."""

    changed: set[int]
    held: dict[int, int]


def retry_now(connection: Connection, ids: Sequence[int], *, stale_after: float) -> set[int]:
    """The ids put back to pending (see ``retry_jobs`` for the skipped ones)."""
    return retry_jobs(connection, ids, stale_after=stale_after).changed


def retry_jobs(connection: Connection, ids: Sequence[int], *, stale_after: float) -> Retried:
    """Retry now, skipping jobs whose unique_while key another job holds (JOB_RETRY_NOW).

    Key locks and retry share one transaction (its own when the caller has none).
    A concurrent *enqueue* of the same key takes no lock: if it commits the key in
    between, the unique index refuses the update, and the statement is rerun once
    under a savepoint, when its fresh snapshot sees that job and skips ours.
    """
    from django.db import IntegrityError

    params: dict[str, Any] = {"ids": list(ids), "stale_after": stale_after, "keep": _keep()}
    with _atomic(connection):
        with connection.cursor() as cursor:
            cursor.execute(RETRY_KEY_LOCK, params)
        for attempt in range(3):
            try:
                with _atomic(connection), connection.cursor() as cursor:
                    cursor.execute(JOB_RETRY_NOW, params)
                    rows = cursor.fetchall()
                break
            except (IntegrityError, psycopg.IntegrityError) as exc:
                diag = getattr(exc, "diag", None) or getattr(exc.__cause__, "diag", None)
                if getattr(diag, "constraint_name", None) != UNIQUE_ACTIVE_INDEX or attempt == 2:
                    raise
    return Retried(
        {r[0] for r in rows if r[1] is None}, {r[0]: r[1] for r in rows if r[1] is not None}
    )


def _keep() -> int:
    from django_pgjobs.conf import get_settings

    return get_settings().MAX_ERRORS_KEPT


def _last_error(error: dict[str, Any]) -> str:
    return f"{error.get('type', 'Error')}: {error.get('message', '')}"[:10000]


# ---------------------------------------------------------------------------
# Pruning, status and the SQL enqueue function (recurring jobs, table health)
# ---------------------------------------------------------------------------

# Delete one batch of finished jobs of one status older than the retention.
# Walks the partial finished_at index oldest first; FOR UPDATE SKIP LOCKED lets
# pruners on many hosts take disjoint rows and never wait on an admin retry of
# the same row (the row is re-checked after locking, so a job retried meanwhile
# is not deleted). Each batch is its own short transaction (autocommit), so row
# locks live for milliseconds. Results go with their job unless they carry an
# idempotency key that must keep protecting; keys of recurring jobs ('cron:...')
# only matter within the catch-up window, so those results go too.
JOB_PRUNE_BATCH = f"""
WITH doomed AS (
    SELECT id FROM {JOB}
     WHERE finished_at IS NOT NULL
       AND finished_at < now() - make_interval(secs => %(older_than)s)
       AND status = %(status)s
     ORDER BY finished_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {JOB} AS j USING doomed WHERE j.id = doomed.id
    RETURNING j.id, j.idempotency_key
), results AS (
    DELETE FROM {RESULT} AS r USING gone
     WHERE r.job_id = gone.id
       AND (gone.idempotency_key IS NULL OR gone.idempotency_key LIKE 'cron:%%')
)
SELECT count(*) FROM gone
"""

# Dry run of the above: how many rows would go. Reads only, takes no row locks.
JOB_PRUNE_COUNT = f"""
SELECT count(*) FROM {JOB}
 WHERE finished_at IS NOT NULL
   AND finished_at < now() - make_interval(secs => %(older_than)s)
   AND status = %(status)s
"""

# Live work per queue, exact: pending rows through the claim index and running
# rows through the running index, one aggregate each, joined per queue. (A single
# scan WHERE status IN ('pending', 'running') cannot use the two partial indexes
# and reads the whole table.) Never the history. No locks.
STATUS_ACTIVE = f"""
WITH pending AS (
    SELECT queue, count(*) AS pending, count(*) FILTER (WHERE run_at <= now()) AS due,
           now() - min(run_at) FILTER (WHERE run_at <= now()) AS lag
      FROM {JOB} WHERE status = '{JobStatus.PENDING}'
     GROUP BY queue
), running AS (
    SELECT queue, count(*) AS running,
           count(*) FILTER (WHERE heartbeat_at < now() - make_interval(secs => %(stale_after)s))
               AS stuck
      FROM {JOB} WHERE status = '{JobStatus.RUNNING}'
     GROUP BY queue
)
SELECT queue, COALESCE(p.pending, 0), COALESCE(p.due, 0), COALESCE(r.running, 0),
       COALESCE(r.stuck, 0), p.lag
  FROM pending AS p FULL JOIN running AS r USING (queue)
"""

# Recently finished per queue and status, with the completions of the last 5 and
# 60 minutes (throughput; complete only for a window of at least an hour): a range
# scan of the partial finished_at index over the window only, so its cost follows
# throughput, not history. No locks.
STATUS_FINISHED = f"""
SELECT queue, status, count(*),
       count(*) FILTER (WHERE finished_at > now() - interval '5 minutes'),
       count(*) FILTER (WHERE finished_at > now() - interval '60 minutes')
  FROM {JOB}
 WHERE finished_at IS NOT NULL AND finished_at > now() - make_interval(secs => %(window)s)
 GROUP BY queue, status
"""

# Dead-lettered within the window: the finished_at index range, restricted to
# dead rows (the status index). No locks.
STATUS_DEAD_RECENT = f"""
SELECT count(*) FROM {JOB}
 WHERE finished_at IS NOT NULL AND finished_at > now() - make_interval(secs => %(window)s)
   AND status = '{JobStatus.DEAD}'
"""

# Vacuum health of a table and, for the jobs table, the planner's statistics of the
# status column (table-wide totals per status without a scan): statistics views
# and catalog only, plus the server's clock. No locks.
TABLE_HEALTH = """
SELECT now(), c.relname, c.reltuples::float8, pg_total_relation_size(c.oid),
       COALESCE(s.n_live_tup, 0), COALESCE(s.n_dead_tup, 0), s.last_autovacuum,
       s.last_vacuum, s.last_autoanalyze, COALESCE(s.autovacuum_count, 0), c.reloptions,
       (SELECT most_common_vals::text FROM pg_stats
         WHERE schemaname = n.nspname AND tablename = c.relname AND attname = 'status'),
       (SELECT most_common_freqs FROM pg_stats
         WHERE schemaname = n.nspname AND tablename = c.relname AND attname = 'status'),
       -- autovacuum off (server-wide, or for this table) means nothing reclaims
       -- the two dead tuples every job leaves behind
       current_setting('autovacuum')::bool
         AND NOT COALESCE('autovacuum_enabled=false' = ANY(c.reloptions), false)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.oid = %(table)s::regclass
"""

# PostgreSQL's estimate of a table's rows (-1: never vacuumed or analyzed). No scan.
TABLE_ESTIMATE = "SELECT reltuples::bigint FROM pg_class WHERE oid = %(table)s::regclass"

# Size of a relation, e.g. the claim index: it should stay small (pending rows
# only); growth without a backlog means bloat that vacuum is not reclaiming.
INDEX_SIZE = "SELECT pg_relation_size(%(index)s::regclass)"

# Registered workers, most recently seen first (LIMIT NULL: all of them), with
# the time since each was last seen (live: within STALE_AFTER).
STATUS_WORKERS = f"""
SELECT id, host, pid, queues, concurrency, started_at, last_seen, now() - last_seen
  FROM {WORKER} ORDER BY last_seen DESC LIMIT %(limit)s
"""

# Queues that have pending or running rows. Pending: the loose index scan of the
# claim index (one probe per queue, as in JOB_CLAIM_ALL). Running: the running
# index, as many rows as jobs in flight. Never the history. No locks.
ACTIVE_QUEUES = f"""
WITH RECURSIVE {_PENDING_QUEUES}
SELECT name FROM qs WHERE name IS NOT NULL
UNION
SELECT DISTINCT queue FROM {JOB} WHERE status = '{JobStatus.RUNNING}'
LIMIT 1000
"""

# pgjobs_enqueue(task, args, kwargs, queue, priority, run_at, idempotency_key,
# max_attempts): enqueue from SQL (pg_cron, triggers, psql). Validates its input
# with errors naming the argument; a NULL argument leaves the column out of the
# INSERT so the table's own defaults apply (the same db_defaults as Python).
# Same statement shape as JOB_INSERT: ON CONFLICT on the partial unique key index
# (waits only for a concurrent inserter of the same key), NOTIFY at commit.
# Returns the new job's id, or NULL when a job with that key already exists.
#
# Version 2 (migration 0003, which holds a frozen copy of this text; a test keeps
# the two equal): the function and the table it writes are schema-qualified with
# the jobs table's own schema and the function runs with a pinned search_path, so
# a caller with another search_path (pg_cron, a trigger, a hostile session) gets
# the same behaviour; arguments are bounded like the Python enqueue's (size from
# the setting pgjobs.max_args_bytes, default 1 MiB; nesting; huge numbers).
# The statement is a DO block that finds the table's schema and creates the
# function in it; @SCHEMA@ is that schema as an identifier, @SCHEMA_LITERAL@ the
# same text escaped for use inside a string literal of the body.
# A list or object nested deeper than validation.MAX_DEPTH inside one argument.
_TOO_DEEP = (
    f'strict $.**{{{MAX_JSON_DEPTH + 1} to last}} ? (@.type() == "array" || @.type() == "object")'
)

ENQUEUE_FUNCTION = f"""
DO $do$
DECLARE
    schema_name text := (SELECT n.nspname FROM pg_class c
                           JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE c.oid = '{JOB}'::regclass);
BEGIN
EXECUTE replace(replace($create$
CREATE OR REPLACE FUNCTION @SCHEMA@.pgjobs_enqueue(
    task text,
    args jsonb DEFAULT NULL,
    kwargs jsonb DEFAULT NULL,
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    cols text[] := ARRAY['task'];
    vals text[] := ARRAY['$1'];
    new_id bigint;
    new_queue text;
    max_bytes bigint := coalesce(
        nullif(current_setting('pgjobs.max_args_bytes', true), '')::bigint, 1048576);
    size bigint := coalesce(octet_length(args::text), 0) + coalesce(octet_length(kwargs::text), 0);
BEGIN
    IF task IS NULL OR length(task) = 0 OR length(task) > 255 THEN
        RAISE EXCEPTION 'pgjobs_enqueue: task must be a registered task name of 1-255 characters, got %',
            coalesce(quote_literal(task), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF size > max_bytes THEN
        RAISE EXCEPTION 'pgjobs_enqueue: args and kwargs are % bytes as JSON, more than pgjobs.max_args_bytes (%); store large data elsewhere and pass its key',
            size, max_bytes USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF args IS NOT NULL THEN
        IF jsonb_typeof(args) <> 'array' THEN
            RAISE EXCEPTION 'pgjobs_enqueue: args must be a JSON array, got %', left(args::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'args'::text; vals := vals || '$2'::text;
    END IF;
    IF kwargs IS NOT NULL THEN
        IF jsonb_typeof(kwargs) <> 'object' THEN
            RAISE EXCEPTION 'pgjobs_enqueue: kwargs must be a JSON object, got %', left(kwargs::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'kwargs'::text; vals := vals || '$3'::text;
    END IF;
    -- What Python could not decode again: nesting deeper than {MAX_JSON_DEPTH} levels
    -- inside an argument, numbers of more than about 4,200 digits.
    IF jsonb_path_exists(coalesce(args, '[]'), '{_TOO_DEEP}')
       OR jsonb_path_exists(coalesce(kwargs, '{{}}'), '{_TOO_DEEP}') THEN
        RAISE EXCEPTION 'pgjobs_enqueue: args or kwargs nest lists/objects more than {MAX_JSON_DEPTH} levels deep'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_path_query(
                   coalesce(args, '[]') || jsonb_build_array(coalesce(kwargs, '{{}}')),
                   'strict $.** ? (@.type() == "number")') AS n(v)
                WHERE length(n.v::text) > 4200) THEN
        RAISE EXCEPTION 'pgjobs_enqueue: args or kwargs hold a number of more than 4200 digits; pass it as a string'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF queue IS NOT NULL THEN
        IF length(btrim(queue)) = 0 OR length(queue) > 100 OR queue <> btrim(queue)
           OR strpos(queue, ',') > 0 THEN
            RAISE EXCEPTION 'pgjobs_enqueue: queue must be 1-100 characters without commas or surrounding spaces, got %',
                quote_literal(queue) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'queue'::text; vals := vals || '$4'::text;
    END IF;
    IF priority IS NOT NULL THEN
        IF priority < {PRIORITY_MIN} OR priority > {PRIORITY_MAX} THEN
            RAISE EXCEPTION 'pgjobs_enqueue: priority must be between {PRIORITY_MIN} and {PRIORITY_MAX} (higher runs first), got %',
                priority USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'priority'::text; vals := vals || '$5'::text;
    END IF;
    IF run_at IS NOT NULL THEN
        IF NOT isfinite(run_at) THEN
            RAISE EXCEPTION 'pgjobs_enqueue: run_at must be a finite time, got %', run_at
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'run_at'::text; vals := vals || '$6'::text;
    END IF;
    IF idempotency_key IS NOT NULL THEN
        IF length(idempotency_key) = 0 OR length(idempotency_key) > 255 THEN
            RAISE EXCEPTION 'pgjobs_enqueue: idempotency_key must be 1-255 characters, got %',
                quote_literal(left(idempotency_key, 300)) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'idempotency_key'::text; vals := vals || '$7'::text;
    END IF;
    IF max_attempts IS NOT NULL THEN
        IF max_attempts < 1 OR max_attempts > 1000 THEN
            RAISE EXCEPTION 'pgjobs_enqueue: max_attempts must be from 1 to 1000, got %',
                max_attempts USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'max_attempts'::text; vals := vals || '$8'::text;
    END IF;
    EXECUTE format(
        'INSERT INTO @SCHEMA_LITERAL@.{JOB} (%s) VALUES (%s) '
        'ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING '
        'RETURNING id, queue',
        array_to_string(cols, ', '), array_to_string(vals, ', '))
    INTO new_id, new_queue
    USING task, args, kwargs, queue, priority, run_at, idempotency_key, max_attempts;
    IF new_id IS NOT NULL THEN
        PERFORM pg_notify('{NOTIFY_CHANNEL}', new_queue);
    END IF;
    RETURN new_id;
END
$fn$
$create$, '@SCHEMA_LITERAL@', replace(quote_ident(schema_name), chr(39), chr(39) || chr(39))),
   '@SCHEMA@', quote_ident(schema_name));
END
$do$
"""
