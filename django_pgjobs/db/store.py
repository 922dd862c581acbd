"""The storage façade: every write to the job rows and their side tables (results,
steps, signals, events, workflow runs and edges, held slots, the worker rows, the
minute counts), one entry each, the one module the packages above ``db/`` call to
write. A reader looking for what changes a job's row starts here, and an
import-linter contract in pyproject.toml keeps it the only way in.

Each entry says what it writes and which lock it takes, and either delegates to the
run function beside its statement (``job_retry`` runs ``job_outcome.JOB_RETRY``) or,
for one statement and its fetch, runs that statement itself; the statements stay
in their modules, by table and purpose, with each lock commented beside its text.

What is not here, and why:

* the claim's ``UPDATE … RETURNING`` (pending to running, the lease bumped) lives
  beside the claim strategies that compile and choose it, ``claim/plain.py``,
  ``claim/limited.py``, ``claim/fair.py``, ``claim/fair_limited.py`` and
  ``claim/chunk.py``; the claim's give-back of a job it cannot run is here
  (``job_release``);
* queue rows (pause, limits) are written by ``queues.py`` through the ORM, and the
  schema (functions, triggers) by the migrations;
* reads with modules of their own stay there (``db/reports.py``,
  ``db/readiness.py``, ``db/error_history.py``). The reads that live in a module of
  writes (a step's history, a stored result, the workflow pages' statements) are
  re-exported at the end, so the contract can be module-wide.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.db import (
    durable,
    events,
    held_slots,
    job_admin,
    job_outcome,
    job_signals,
    prune,
    reap,
    rollup,
    workers,
    workflows,
)
from django_pgjobs.db import job_insert as inserts
from django_pgjobs.db.cursor import Connection

# -------------------------------------------------------------------- insert (enqueue)


def insert_params(**values: Any) -> dict[str, Any]:
    """The parameters of an insert (``JOB_INSERT``, ``JOB_DEBOUNCE``), unset columns NULL."""
    return inserts.insert_params(**values)


def job_insert(
    cursor: Any, params: dict[str, Any], *, flow: bool = False, delayed: bool = False
) -> Sequence[Any] | None:
    """INSERT one job (``JOB_INSERT`` family), ON CONFLICT DO NOTHING on its keys: no
    row lock, the unique indexes decide; None when a key is taken."""
    return inserts.job_insert(cursor, params, flow=flow, delayed=delayed)


def job_debounce(cursor: Any, columns: str, params: dict[str, Any]) -> Sequence[Any] | None:
    """INSERT a debounced job or UPDATE the pending one holding its key (``JOB_DEBOUNCE``):
    the upsert locks that one row; the whole row back (``columns``)."""
    cursor.execute(_filled(inserts.JOB_DEBOUNCE, columns), params)
    row: Sequence[Any] | None = cursor.fetchone()
    return row


def job_copy(cursor: Any, columns: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """COPY ``rows`` into the jobs table (``JOB_COPY``): plain inserts, no row lock."""
    inserts.job_copy(cursor, columns, rows)


# ------------------------------------------------------------- outcomes (the worker)


def job_heartbeat(connection: Connection, items: Sequence[tuple[int, int]]) -> set[int]:
    """UPDATE ``heartbeat_at`` of our running jobs (``JOB_HEARTBEAT``), rows locked in id
    order, lease-fenced; the ids no longer ours."""
    return job_outcome.job_heartbeat(connection, items)


def job_complete_many(
    connection: Connection, items: Sequence[tuple[int, int, Any]], *, redo: bool = True
) -> set[int]:
    """UPDATE jobs to completed and INSERT their results (``JOB_COMPLETE_MANY[_REDO]``),
    rows locked in id order, lease-fenced; the ids that were ours."""
    return job_outcome.job_complete_many(connection, items, redo=redo)


def job_complete_chunk(
    connection: Connection, items: Sequence[tuple[int, int, Any, str]]
) -> set[int]:
    """``job_complete_many`` of jobs that ran in a chunk, each also recording its chunk
    run (``JOB_COMPLETE_CHUNK``, the redo form)."""
    return job_outcome.job_complete_many(connection, items, chunk=True)


def job_retry(
    connection: Connection,
    *,
    id: int,
    lease: int,
    delay: float,
    error: dict[str, Any],
    suspect: bool = False,
) -> str | None:
    """UPDATE a failed attempt to pending later or dead (``JOB_RETRY``), the one row by
    primary key, lease-fenced; its new status, None when not ours."""
    return job_outcome.job_retry(
        connection, id=id, lease=lease, delay=delay, error=error, suspect=suspect
    )


def job_timed_out(
    connection: Connection,
    *,
    id: int,
    lease: int,
    delay: float,
    error: dict[str, Any],
    retry: bool,
    suspect: bool = False,
) -> str | None:
    """UPDATE a run past its timeout (``JOB_TIMED_OUT``), the one row, lease-fenced and
    bumped; its new status, None when not ours."""
    return job_outcome.job_timed_out(
        connection, id=id, lease=lease, delay=delay, error=error, retry=retry, suspect=suspect
    )


def job_dead(connection: Connection, *, id: int, lease: int, error: dict[str, Any]) -> bool:
    """UPDATE a claimed job to dead (``JOB_DEAD``), the one row, lease-fenced."""
    return job_outcome.job_dead(connection, id=id, lease=lease, error=error)


def job_release(
    connection: Connection, *, id: int, lease: int, still_running: bool = False
) -> bool:
    """UPDATE a claimed job back to pending, uncounted (``JOB_RELEASE``), the one row,
    lease-fenced: the give-back of a claim, a shutdown, a lost run."""
    return job_outcome.job_release(connection, id=id, lease=lease, still_running=still_running)


def job_release_many(connection: Connection, told: Sequence[tuple[int, int]]) -> set[int]:
    """UPDATE claimed jobs that never started back to pending (``JOB_RELEASE_MANY``), rows
    locked in id order, lease-fenced; the ids released."""
    return job_outcome.job_release_many(connection, told)


def job_dead_exhausted(connection: BaseDatabaseWrapper, *, worker: str) -> list[tuple[int, str]]:
    """UPDATE pending jobs with no attempts left to dead (``JOB_DEAD_EXHAUSTED``),
    ``FOR UPDATE SKIP LOCKED``; their (id, task)."""
    return job_outcome.job_dead_exhausted(connection, worker=worker)


def job_park(
    connection: Connection,
    *,
    id: int,
    lease: int,
    until: datetime | None,
    waiting_for: str,
    seen: int,
    signal: bool = False,
) -> str | None:
    """UPDATE a durable run to waiting (``JOB_PARK``), the one row, lease-fenced (a wait
    for a signal tries the job's signal lock first); its new status."""
    return durable.job_park(
        connection,
        id=id,
        lease=lease,
        until=until,
        waiting_for=waiting_for,
        seen=seen,
        signal=signal,
    )


def held_slot_free(connection: Connection, *, worker: str, runs: Sequence[tuple[int, int]]) -> int:
    """DELETE the held limit slots of runs seen to end (``HELD_SLOT_FREE``), by primary
    key, fenced by job, lease and worker; how many."""
    return held_slots.held_slot_free(connection, worker=worker, runs=runs)


# -------------------------------------------------------------- durable steps, wakes


def step_record(
    connection: Connection,
    *,
    job_id: int,
    lease: int,
    name: str,
    occurrence: int,
    kind: str,
    result: str | None,
) -> tuple[bool, int | None]:
    """INSERT a durable step (``STEP_RECORD``) under the job row's ``FOR NO KEY UPDATE``
    lock, lease-fenced; (ours, seq)."""
    return durable.step_record(
        connection,
        job_id=job_id,
        lease=lease,
        name=name,
        occurrence=occurrence,
        kind=kind,
        result=result,
    )


def job_wake_due(connection: Connection, *, limit: int = 1000) -> int:
    """UPDATE waiting jobs whose time came to pending (``JOB_WAKE_DUE``), ``FOR UPDATE
    SKIP LOCKED``; how many."""
    return durable.job_wake_due(connection, limit=limit)


def job_wake_now(connection: Connection, ids: Sequence[int]) -> set[int]:
    """UPDATE the waiting jobs of ``ids`` to pending now (``JOB_WAKE_NOW``), rows locked in
    id order; the ids woken."""
    return durable.job_wake_now(connection, ids)


def job_advance_waiting(
    connection: Connection, seconds: float, queues: Sequence[str] | None = None
) -> int:
    """UPDATE waiting jobs' clocks forward (``JOB_ADVANCE_WAITING``, ``run_jobs(advance=)``
    only); how many."""
    return durable.job_advance_waiting(connection, seconds, queues)


# ---------------------------------------------------------------- signals and events


def signal_send(cursor: Any, params: dict[str, Any]) -> tuple[str, int | None] | None:
    """INSERT a signal and wake its waiting job (``SIGNAL_SEND``) behind the job's signal
    lock, shared, in the caller's transaction."""
    return job_signals.signal_send(cursor, params)


def signal_take(
    cursor: Any, *, job_id: int, name: str, step: str
) -> tuple[int, int | None, Any] | None:
    """UPDATE the oldest unconsumed signal to consumed (``SIGNAL_TAKE``) behind the job's
    signal lock, exclusive; locks that signal row."""
    return job_signals.signal_take(cursor, job_id=job_id, name=name, step=step)


def event_emit(cursor: Any, params: dict[str, Any]) -> int:
    """INSERT an event and wake its waiting jobs (``EVENT_INSERT``) behind the (name, key)
    lock, shared, in the caller's transaction; its id."""
    return events.event_emit(cursor, params)


def event_look(cursor: Any, params: dict[str, Any]) -> tuple[int, int | None, Any, bool] | None:
    """Read the event a wait gets (``EVENT_LOOK``) behind the (name, key) lock, exclusive;
    written with the step that records it."""
    return events.event_look(cursor, params)


# ------------------------------------------------------------- operators (admin, code)


def job_retry_now(connection: Connection, ids: Sequence[int], *, stale_after: float) -> Retried:
    """UPDATE dead, cancelled or stuck jobs back to pending (``JOB_RETRY_NOW``) behind
    their keys' advisory locks and their parents' row locks, rows in id order."""
    return job_admin.job_retry_now(connection, ids, stale_after=stale_after)


def job_cancel(connection: Connection, ids: Sequence[int]) -> set[int]:
    """UPDATE unfinished jobs to cancelled, lease bumped (``JOB_CANCEL``), rows locked in
    id order; the ids cancelled."""
    return job_admin.job_cancel(connection, ids)


#: What a retry did (``job_retry_now``): the ids retried, the ids skipped for a held key.
Retried = job_admin.Retried

# --------------------------------------------------------------- maintenance passes


def job_reap_stale(
    connection: Connection, *, stale_after: float, batch: int = 500
) -> list[tuple[int, str, str, int, str | None]]:
    """UPDATE running jobs of silent workers to pending or dead (``JOB_REAP_STALE``), ``FOR
    UPDATE SKIP LOCKED``, lease bumped."""
    return reap.job_reap_stale(connection, stale_after=stale_after, batch=batch)


def job_prune_batch(cursor: Any, *, status: str, older_than: float, batch: int) -> int:
    """DELETE one batch of finished jobs past retention (``JOB_PRUNE_BATCH``), ``FOR
    UPDATE SKIP LOCKED``; how many."""
    params = {"status": status, "older_than": older_than, "batch": batch}
    cursor.execute(prune.JOB_PRUNE_BATCH, params)
    return int(cursor.fetchone()[0])


def job_prune_count(cursor: Any, *, status: str, older_than: float) -> int:
    """Count what ``job_prune_batch`` would delete (``JOB_PRUNE_COUNT``, a dry run): no lock."""
    cursor.execute(prune.JOB_PRUNE_COUNT, {"status": status, "older_than": older_than})
    return int(cursor.fetchone()[0])


def event_prune_batch(cursor: Any, *, older_than: float | None, batch: int) -> int:
    """DELETE one batch of events past retention (``EVENT_PRUNE_BATCH``), ``FOR UPDATE SKIP
    LOCKED``; how many."""
    cursor.execute(events.EVENT_PRUNE_BATCH, {"older_than": older_than, "batch": batch})
    return int(cursor.fetchone()[0])


def event_prune_count(cursor: Any, *, older_than: float | None) -> int:
    """Count what ``event_prune_batch`` would delete (``EVENT_PRUNE_COUNT``): no lock."""
    cursor.execute(events.EVENT_PRUNE_COUNT, {"older_than": older_than})
    return int(cursor.fetchone()[0])


def known_tasks_touch(cursor: Any, *, stale_after: float, every: float) -> None:
    """UPSERT when a live worker last knew each task (``KNOWN_TASKS_TOUCH``)."""
    cursor.execute(workers.KNOWN_TASKS_TOUCH, {"stale_after": stale_after, "every": every})


def job_dead_unknown(cursor: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """UPDATE pending jobs of a task no live worker knows to dead (``JOB_DEAD_UNKNOWN``),
    ``FOR UPDATE SKIP LOCKED``; their (id, task)."""
    cursor.execute(workers.JOB_DEAD_UNKNOWN, params)
    return list(cursor.fetchall())


def rollup_mark_insert(connection: Connection) -> None:
    """INSERT the minute counts' mark row when missing (``ROLLUP_MARK_INSERT``)."""
    rollup.rollup_mark_insert(connection)


def rollup_lock(
    connection: Connection,
) -> tuple[datetime | None, datetime | None, datetime, datetime] | None:
    """Lock the mark row ``FOR UPDATE SKIP LOCKED`` (``ROLLUP_LOCK``): one pass at a time."""
    return rollup.rollup_lock(connection)


def rollup_minutes(
    connection: Connection, *, since: datetime, until: datetime, keep_from: datetime
) -> int:
    """UPSERT the finished jobs of ``[since, until)`` into the minutes, move the mark
    (``ROLLUP_MINUTES``), under ``rollup_lock``; locks no job row."""
    return rollup.rollup_minutes(connection, since=since, until=until, keep_from=keep_from)


# ---------------------------------------------------------------------- worker rows


def worker_upsert(cursor: Any, params: dict[str, Any]) -> None:
    """UPSERT this worker's row (``WORKER_UPSERT``), by primary key."""
    cursor.execute(workers.WORKER_UPSERT, params)


def worker_delete(cursor: Any, worker_id: str) -> None:
    """DELETE this worker's row at exit (``WORKER_DELETE``), by primary key."""
    cursor.execute(workers.WORKER_DELETE, {"id": worker_id})


def worker_forget_stale(cursor: Any, *, older_than: float) -> None:
    """DELETE the rows of workers silent for ``older_than`` seconds (``WORKER_FORGET_STALE``)."""
    cursor.execute(workers.WORKER_FORGET_STALE, {"older_than": older_than})


# ------------------------------------------------------------ workflows and batches


def wf_create(cursor: Any, *, name: str, kind: str, n: int) -> tuple[int, list[int]]:
    """INSERT a workflow run's row and allocate its ``n`` job ids (``WF_CREATE``): no lock."""
    cursor.execute(workflows.WF_CREATE, {"name": name, "kind": kind, "n": n})
    run_id, ids = cursor.fetchone()
    return run_id, ids


def wf_insert_nodes(cursor: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """INSERT one chunk of a graph's jobs and edges (``WF_INSERT_NODES``), ON CONFLICT DO
    NOTHING on their keys; the rows written."""
    cursor.execute(workflows.WF_INSERT_NODES, params)
    return list(cursor.fetchall())


def wf_cancel(cursor: Any, run_id: int) -> int:
    """UPDATE a run's unfinished jobs to cancelled (``WF_CANCEL``, rows in id order, lease
    bumped), then its row (``WF_MARK_CANCELLED``); how many jobs."""
    cursor.execute(workflows.WF_CANCEL, {"id": run_id})
    changed = len(cursor.fetchall())
    cursor.execute(workflows.WF_MARK_CANCELLED, {"id": run_id})
    return changed


def batch_open(cursor: Any, run_id: int, callbacks: str) -> None:
    """UPDATE a batch's row with its callbacks (``BATCH_OPEN``), in its enqueue's transaction."""
    cursor.execute(workflows.BATCH_OPEN, {"id": run_id, "callbacks": callbacks})


def batch_state(cursor: Any, run_id: int) -> tuple[Any, ...] | None:
    """Lock a batch's row ``FOR NO KEY UPDATE`` and read whether it is closed and its
    members (``BATCH_STATE``), before ``batch_close``."""
    cursor.execute(workflows.BATCH_STATE, {"id": run_id})
    row: tuple[Any, ...] | None = cursor.fetchone()
    return row


def batch_close(cursor: Any, run_id: int) -> tuple[int, bool]:
    """UPDATE a batch locked by ``batch_state`` to closed (``BATCH_CLOSE``); (members, due)."""
    cursor.execute(workflows.BATCH_CLOSE, {"id": run_id})
    members, due = cursor.fetchone()
    return members, due


def batch_fire(cursor: Any, run_id: int) -> None:
    """Release or cancel a complete batch's callbacks (``BATCH_FIRE``, the trigger's
    ``pgjobs_batch_fire``), which locks them in id order."""
    cursor.execute(workflows.BATCH_FIRE, {"id": run_id})


def wf_repair_lock(cursor: Any, *, after: int, batch: int, min_age: float) -> list[int]:
    """Lock a batch of blocked jobs ``FOR NO KEY UPDATE SKIP LOCKED`` (``WF_REPAIR_LOCK``)."""
    cursor.execute(workflows.WF_REPAIR_LOCK, {"after": after, "batch": batch, "min_age": min_age})
    return [r[0] for r in cursor.fetchall()]


def wf_repair(cursor: Any, ids: Sequence[int]) -> list[tuple[int, str]]:
    """UPDATE the counters of blocked jobs locked by ``wf_repair_lock`` from their parents
    (``WF_REPAIR``); the (id, status) of those it released or cancelled."""
    cursor.execute(workflows.WF_REPAIR, {"ids": ids})
    return [(r[0], r[1]) for r in cursor.fetchall() if r[0] is not None]


def batch_repair(cursor: Any, *, batch: int) -> list[int]:
    """UPDATE the counts of closed batches whose members all finished, unfired
    (``BATCH_REPAIR``, ``FOR NO KEY UPDATE SKIP LOCKED``); their ids, to ``batch_fire``."""
    cursor.execute(workflows.BATCH_REPAIR, {"batch": batch})
    return [r[0] for r in cursor.fetchall()]


def batch_abandoned(cursor: Any, *, grace: float, batch: int) -> list[int]:
    """Lock open batches whose block never closed them (``BATCH_ABANDONED``, ``FOR NO KEY
    UPDATE SKIP LOCKED``); their ids, to close."""
    cursor.execute(workflows.BATCH_ABANDONED, {"grace": grace, "batch": batch})
    return [r[0] for r in cursor.fetchall()]


# ------------------------------------------- statements run by another process, as text

#: The heartbeat process (``pulse.py``) beats jobs and the worker row with these texts.
JOB_HEARTBEAT_PULSE = job_outcome.JOB_HEARTBEAT_PULSE
WORKER_UPSERT = workers.WORKER_UPSERT
#: pg_cron runs the reaper's and the pruners' statements (``maintenance/pg_cron_engine.py``).
JOB_REAP_STALE = reap.JOB_REAP_STALE
JOB_PRUNE_BATCH = prune.JOB_PRUNE_BATCH
EVENT_PRUNE_BATCH = events.EVENT_PRUNE_BATCH
reap_params = reap.reap_params

# ------------------------------------------------ reads that live beside the writes

JOB_BY_KEY = inserts.JOB_BY_KEY
JOB_BY_UNIQUE_KEY = inserts.JOB_BY_UNIQUE_KEY
DELAYED_RUN_AT = inserts.DELAYED_RUN_AT
Encoded = job_outcome.Encoded
encode_result = job_outcome.encode_result
result_by_key = job_outcome.result_by_key
signal_by_key = job_signals.signal_by_key
History = durable.History
StepRow = durable.StepRow
step_history = durable.step_history
step_recorded = durable.step_recorded
NO_LIMIT = durable.NO_LIMIT
WORKER_FRESH = workers.WORKER_FRESH
live_tasks = workers.live_tasks
unknown_pending = workers.unknown_pending
STATUS_BLOCKED = workflows.STATUS_BLOCKED
PARENT_EDGES = workflows.PARENT_EDGES
PARENT_MISSING = workflows.PARENT_MISSING
PARENT_RESULT_PAGE = workflows.PARENT_RESULT_PAGE
PARENT_RESULT_PIECES = workflows.PARENT_RESULT_PIECES
WF_NODES = workflows.WF_NODES
WF_EDGES = workflows.WF_EDGES
WF_STATUS_COUNTS = workflows.WF_STATUS_COUNTS
WF_LIST_PROGRESS = workflows.WF_LIST_PROGRESS
WF_GRAPH_NODES = workflows.WF_GRAPH_NODES
WF_GRAPH_EDGES = workflows.WF_GRAPH_EDGES
WF_FAILED_ROOTS = workflows.WF_FAILED_ROOTS


@functools.cache
def _filled(template: str, columns: str) -> str:
    """A statement returning whole rows, with the model's column list filled in once."""
    return template.format(columns=columns)
