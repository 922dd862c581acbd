"""Putting jobs in the table: the JOB_INSERT family (one job, one statement, with its
wake-up), the lookups of the job that holds a key, and the bulk COPY."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django_pgjobs.db.epoch import epoch_us
from django_pgjobs.db.notify import due_payload
from django_pgjobs.db.tables import JOB, NOTIFY_CHANNEL
from django_pgjobs.states import ACTIVE, JobStatus

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
    # the batch the job joins (workflows.batch; NULL outside a batch block)
    ("workflow_id", "%(workflow_id)s"),
)
_FLOW_COLUMNS = (
    ("concurrency_key", "%(concurrency_key)s"),
    ("concurrency_limit", "%(concurrency_limit)s"),
    ("fair_key", "%(fair_key)s"),
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
# unique key among blocked/pending/running jobs) the same way. pg_notify is delivered at
# commit, so a rolled-back enqueue wakes nobody.
def _insert_statement(*, flow: bool, delayed: bool) -> str:
    columns = _INSERT_COLUMNS + (_FLOW_COLUMNS if flow else ())
    values = [_DELAYED_RUN_AT if delayed and name == "run_at" else value for name, value in columns]
    conflict = "" if flow else " (idempotency_key) WHERE idempotency_key IS NOT NULL"
    return f"""
WITH ins AS (
    INSERT INTO {JOB} ({", ".join(name for name, _ in columns)})
    VALUES ({", ".join(values)})
    ON CONFLICT{conflict} DO NOTHING
    RETURNING id, queue, priority, run_at, created_at
)
SELECT ins.id,
       -- times as exact epoch microseconds: cheaper to decode than timestamptz
       {epoch_us("ins.run_at")},
       {epoch_us("ins.created_at")},
       pg_notify('{NOTIFY_CHANNEL}', {due_payload("ins.queue", "ins.run_at", "ins.priority")})::text
  FROM ins
"""


JOB_INSERT = _insert_statement(flow=False, delayed=False)
JOB_INSERT_DELAYED = _insert_statement(flow=False, delayed=True)
# Only jobs with a concurrency key, a fair key or a unique_while key take the flow
# members.
JOB_INSERT_FLOW = _insert_statement(flow=True, delayed=False)
JOB_INSERT_FLOW_DELAYED = _insert_statement(flow=True, delayed=True)


def job_insert(
    cursor: Any, params: dict[str, Any], *, flow: bool = False, delayed: bool = False
) -> Sequence[Any] | None:
    """JOB_INSERT (the family's member for these options): INSERT one job with
    ``params`` (``insert_params``), ON CONFLICT DO NOTHING on its keys: no row lock,
    the unique indexes decide. ``(id, run_at, created_at, _)`` of the new row, the times
    in epoch microseconds, or None when a key is taken (nothing was written)."""
    if flow:
        statement = JOB_INSERT_FLOW_DELAYED if delayed else JOB_INSERT_FLOW
    else:
        statement = JOB_INSERT_DELAYED if delayed else JOB_INSERT
    cursor.execute(statement, params)
    row: Sequence[Any] | None = cursor.fetchone()
    return row


# The predicate of the unique index of active keys (models.py), as ON CONFLICT names
# it to infer that index.
UNIQUE_KEY_HELD = (
    "unique_key IS NOT NULL AND status IN ("
    + ", ".join(f"'{status}'" for status in sorted(ACTIVE))
    + ")"
)

# A debounced enqueue (debounce.py), one statement: insert the job, or, when a pending
# job holds its key, move that job on instead. ON CONFLICT on the partial unique index
# of active keys (the unique_while index; a debounced key is in the "pending:" mode, so
# the claim clears it and only pending or blocked rows hold one) waits for a concurrent
# enqueue of the same key to commit or roll back, then updates the row it committed:
# concurrent enqueues of one key make one job, with no read-then-write race. The
# update takes the row lock of that pending job (a claim skips it while locked, and
# waits for nothing). run_at only moves later (GREATEST: an enqueue whose transaction
# began earlier has an earlier now()), and never past debounce_until, set once by the
# first enqueue. A key held by a blocked workflow job is not touched (the WHERE):
# nothing is returned and the caller reads the holder, as for unique_while.
# {columns}: the model's column list, so the row becomes a ``Job`` with ``from_db``;
# ``inserted``: whether this enqueue made the row.
JOB_DEBOUNCE = f"""
WITH up AS (
    INSERT INTO {JOB} AS j (task, queue, priority, args, kwargs, run_at, max_attempts,
                            timeout, trace_context, workflow_id, concurrency_key,
                            concurrency_limit, fair_key, unique_key, debounce_until)
    VALUES (%(task)s, %(queue)s, %(priority)s, %(args)s::jsonb, %(kwargs)s::jsonb,
            now() + make_interval(secs => %(delay)s), %(max_attempts)s, %(timeout)s,
            %(trace_context)s::jsonb, %(workflow_id)s, %(concurrency_key)s,
            %(concurrency_limit)s, %(fair_key)s, %(unique_key)s,
            now() + make_interval(secs => %(max_wait)s))
    ON CONFLICT (unique_key) WHERE {UNIQUE_KEY_HELD}
    DO UPDATE SET
        run_at = LEAST(GREATEST(j.run_at, EXCLUDED.run_at), j.debounce_until),
        args = CASE WHEN %(keep_latest)s THEN EXCLUDED.args ELSE j.args END,
        kwargs = CASE WHEN %(keep_latest)s THEN EXCLUDED.kwargs ELSE j.kwargs END,
        concurrency_key = CASE WHEN %(keep_latest)s THEN EXCLUDED.concurrency_key
                               ELSE j.concurrency_key END,
        concurrency_limit = CASE WHEN %(keep_latest)s THEN EXCLUDED.concurrency_limit
                                 ELSE j.concurrency_limit END,
        fair_key = CASE WHEN %(keep_latest)s THEN EXCLUDED.fair_key ELSE j.fair_key END
     WHERE j.status = '{JobStatus.PENDING}' AND j.debounce_until IS NOT NULL
    RETURNING {{columns}}, j.xmax = 0 AS inserted
)
-- the job's (new) time wakes idle workers at commit, as for any enqueue
SELECT up.*,
       pg_notify('{NOTIFY_CHANNEL}', {due_payload("up.queue", "up.run_at", "up.priority")})::text
  FROM up
"""

# The run_at of a delayed bulk enqueue (COPY takes values, not expressions).
DELAYED_RUN_AT = "SELECT now() + make_interval(secs => %s)"

# The existing job that owns an idempotency key (after ON CONFLICT DO NOTHING), and
# the job that holds a unique_while key (the partial unique index's predicate).
# {columns}: the model's column list, filled in once by the caller (jobs/enqueue.py), so
# the row becomes a ``Job`` with ``from_db``.
JOB_BY_KEY = f"SELECT {{columns}} FROM {JOB} WHERE idempotency_key = %s"
# (A blocked workflow job holds its key from its enqueue, like a pending one; a
# waiting durable job holds it between its runs.)
JOB_BY_UNIQUE_KEY = (
    f"SELECT {{columns}} FROM {JOB} WHERE unique_key = %s AND status IN "
    f"('{JobStatus.BLOCKED}', '{JobStatus.WAITING}', '{JobStatus.PENDING}', "
    f"'{JobStatus.RUNNING}')"
)

# enqueue_many's bulk insert ({columns}: the columns the batch sets; the rest take
# their db_default). One statement per batch, inside the caller's transaction.
JOB_COPY = f"COPY {JOB} ({{columns}}) FROM STDIN"


def job_copy(cursor: Any, columns: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """JOB_COPY: ``COPY ... FROM STDIN`` of ``rows`` into the jobs table (``columns``: the
    columns they set), plain inserts, no row lock; through the connection's
    ``execute_wrappers`` as ``executemany`` would go (``many=True``, the rows as its
    params).

    psycopg's copy API bypasses Django's wrappers; this way instrumentation, and the
    fault suite's injector (tests/faults/injector.py), see the bulk insert too.
    """
    db = cursor.db

    def copy_executor(text: str, params: Any, many: bool, context: dict[str, Any]) -> None:
        with cursor.cursor.copy(text) as copy:
            for row in params:
                copy.write_row(row)

    executor: Callable[..., Any] = copy_executor
    for wrapper in reversed(db.execute_wrappers):  # the order Django applies them in
        executor = functools.partial(wrapper, executor)
    executor(JOB_COPY.format(columns=columns), rows, True, {"connection": db, "cursor": cursor})
