"""The limited claim (flow control: pause, ``max_running``, ``rate``, concurrency keys):
serialised by an advisory lock, it counts what runs (running rows and held slots,
``db/held_slots.py``) and ranks before it locks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.claim.plain import mark_running, task_array
from django_pgjobs.claim.rows import Claimed, from_rows
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import HELD_SLOT, JOB, QUEUE, pending_queues_cte
from django_pgjobs.jobs import registry
from django_pgjobs.states import JobStatus

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
# and queues at a limit drop out. What runs is the running rows (read through the
# running index: as many rows as jobs in flight) and the slots still held by runs
# written off while their thread goes on (db/held_slots.py: a small table, empty
# unless runs timed out, were cancelled or reclaimed). A queue without a row is
# unlimited.
_FLOW_ALLOWANCE = f"""allowance AS MATERIALIZED (
    SELECT qs.name,
           LEAST(%(n)s,
                 COALESCE(q.max_running - (SELECT count(*) FROM {JOB} r
                                            WHERE r.status = '{JobStatus.RUNNING}'
                                              AND r.queue = qs.name)
                                        - (SELECT count(*) FROM {HELD_SLOT} h
                                            WHERE h.queue = qs.name), %(n)s),
                 COALESCE({_RATE_N} - (SELECT count(*)
                                         FROM jsonb_array_elements_text(q.rate_log) AS t(at)
                                        WHERE t.at::numeric > {_NOW_EPOCH} - {_RATE_PERIOD}),
                          %(n)s)
           ) AS allow
      FROM qs LEFT JOIN {QUEUE} q ON q.name = qs.name
     WHERE qs.name IS NOT NULL AND NOT COALESCE(q.paused, false)
), busy AS MATERIALIZED (
    -- what runs per concurrency key: running jobs (running index: jobs in flight
    -- only) and held slots
    SELECT r.key, count(*) AS running FROM (
        SELECT concurrency_key AS key FROM {JOB}
         WHERE status = '{JobStatus.RUNNING}' AND concurrency_key IS NOT NULL
        UNION ALL
        SELECT concurrency_key FROM {HELD_SLOT} WHERE concurrency_key IS NOT NULL
    ) AS r
     GROUP BY r.key
)"""

# The rate limit's sliding window, after a claim (the CTE ``claimed``).
_RATE_LOGGED = f"""    -- the sliding window of the rate limit: this claim's starts, and the starts
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
"""

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
), claimed AS ({mark_running()}), logged AS (
{_RATE_LOGGED})
SELECT * FROM claimed"""


def allowance_ctes() -> str:
    """The CTEs ``allowance`` and ``busy`` over the queues ``qs(name)``, for a limited
    claim put together elsewhere (``fair_limited.py``)."""
    return _FLOW_ALLOWANCE


def rate_logged() -> str:
    """The body of the CTE that logs a limited claim's starts for the rate limit."""
    return _RATE_LOGGED


# Limited claim from a list of queues (after FLOW_LOCK, same transaction).
JOB_CLAIM_LIMITED_QUEUES = f"""
WITH qs(name) AS (SELECT unnest(%(queues)s::text[])),
{_FLOW_ALLOWANCE},
{_FLOW_PICK}
"""

# Limited claim from every queue with pending rows (loose index scan, as above).
JOB_CLAIM_LIMITED_ALL = f"""
WITH RECURSIVE {pending_queues_cte()},
{_FLOW_ALLOWANCE},
{_FLOW_PICK}
"""

declare("JOB_CLAIM_LIMITED_QUEUES", (JobStatus.PENDING, JobStatus.RUNNING))
declare("JOB_CLAIM_LIMITED_ALL", (JobStatus.PENDING, JobStatus.RUNNING))


def job_claim_limited(
    connection: BaseDatabaseWrapper,
    *,
    worker: str,
    queues: Sequence[str] | None,
    n: int,
    tasks: Sequence[str] | None,
) -> list[Claimed]:
    """FLOW_LOCK, then JOB_CLAIM_LIMITED_ALL (``queues=None``) or _QUEUES, in one short
    transaction (see FLOW_LOCK). ``tasks=None``: every registered task."""
    params: dict[str, Any] = {"worker": worker, "n": n}
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
    return from_rows(rows)


# The flow-control state workers cache (refreshed every POLL_INTERVAL and on a
# queue-change NOTIFY): only rows that limit something. No locks.
QUEUE_LIMITS = f"""
SELECT name, paused, max_running, rate FROM {QUEUE}
 WHERE paused OR max_running IS NOT NULL OR rate IS NOT NULL
"""


def queue_limits(connection: BaseDatabaseWrapper) -> list[tuple[str, bool, int | None, str | None]]:
    """The rows of QUEUE_LIMITS: (name, paused, max_running, rate)."""
    with connection.cursor() as cursor:
        cursor.execute(QUEUE_LIMITS)
        return [(r[0], r[1], r[2], r[3]) for r in cursor.fetchall()]
