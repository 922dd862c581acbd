"""The storage façade: every write to the job rows and their side tables (results,
steps, signals, events, workflow runs and edges, held slots, the worker rows, the
minute counts), one entry each, the one module the packages above ``db/`` call to
write. A reader looking for what changes a job's row starts here, and an
import-linter contract in pyproject.toml keeps it the only way in.

Each entry says what it writes and which lock it takes. An entry that only calls the
run function beside its statement re-exports it (``job_retry = job_outcome.job_retry``
runs ``JOB_RETRY``), so callers and mypy see its own signature: a one-line comment
here names the statement and the lock, and the function's docstring says the rest.
An entry that runs a statement and its fetch itself, or calls a run function its own
way (a fixed argument, narrower types), is a function here. The statements stay in
their modules, by table and purpose, with each lock commented beside its text.

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
from typing import Any

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


# JOB_INSERT, JOB_DEBOUNCE: their parameters, unset columns NULL; writes nothing itself
insert_params = inserts.insert_params

# JOB_INSERT family: INSERT one job, ON CONFLICT DO NOTHING on its keys, no row lock
job_insert = inserts.job_insert


def job_debounce(cursor: Any, columns: str, params: dict[str, Any]) -> Sequence[Any] | None:
    """INSERT a debounced job or UPDATE the pending one holding its key (``JOB_DEBOUNCE``):
    the upsert locks that one row; the whole row back (``columns``)."""
    cursor.execute(_filled(inserts.JOB_DEBOUNCE, columns), params)
    row: Sequence[Any] | None = cursor.fetchone()
    return row


# JOB_COPY: COPY rows into the jobs table, plain inserts, no row lock
job_copy = inserts.job_copy


# ------------------------------------------------------------- outcomes (the worker)


# JOB_HEARTBEAT: UPDATE heartbeat_at, rows locked in id order, lease-fenced
job_heartbeat = job_outcome.job_heartbeat


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


# JOB_RETRY: UPDATE a failed attempt to pending later or dead, the one row, lease-fenced
job_retry = job_outcome.job_retry

# JOB_TIMED_OUT: UPDATE a run past its timeout, the one row, lease-fenced and bumped
job_timed_out = job_outcome.job_timed_out

# JOB_DEAD: UPDATE a claimed job to dead, the one row, lease-fenced
job_dead = job_outcome.job_dead

# JOB_RELEASE: UPDATE a claimed job back to pending, the one row, lease-fenced
job_release = job_outcome.job_release

# JOB_RELEASE_MANY: UPDATE unstarted claims to pending, rows locked in id order, lease-fenced
job_release_many = job_outcome.job_release_many

# JOB_DEAD_EXHAUSTED: UPDATE pending jobs to dead, FOR UPDATE SKIP LOCKED
job_dead_exhausted = job_outcome.job_dead_exhausted

# JOB_PARK: UPDATE a run to waiting, the one row, lease-fenced (a signal wait: its lock)
job_park = durable.job_park

# HELD_SLOT_FREE: DELETE held slots by primary key, fenced by job, lease and worker
held_slot_free = held_slots.held_slot_free


# -------------------------------------------------------------- durable steps, wakes


# STEP_RECORD: INSERT a step under the job row's FOR NO KEY UPDATE lock, lease-fenced
step_record = durable.step_record

# JOB_WAKE_DUE: UPDATE due waiting jobs to pending, FOR UPDATE SKIP LOCKED
job_wake_due = durable.job_wake_due

# JOB_WAKE_NOW: UPDATE waiting jobs to pending now, rows locked in id order
job_wake_now = durable.job_wake_now

# JOB_ADVANCE_WAITING: UPDATE waiting jobs' clocks forward, run_jobs(advance=) only
job_advance_waiting = durable.job_advance_waiting


# ---------------------------------------------------------------- signals and events


# SIGNAL_SEND: INSERT a signal, wake its job, behind the job's signal lock, shared
signal_send = job_signals.signal_send

# SIGNAL_TAKE: UPDATE a signal to consumed, behind the job's signal lock, exclusive
signal_take = job_signals.signal_take

# EVENT_INSERT: INSERT an event, wake its jobs, behind the (name, key) lock, shared
event_emit = events.event_emit

# EVENT_LOOK: read a wait's event behind the (name, key) lock, exclusive
event_look = events.event_look


# ------------------------------------------------------------- operators (admin, code)


# JOB_RETRY_NOW: UPDATE back to pending behind key and parent locks, rows in id order
job_retry_now = job_admin.job_retry_now

# JOB_CANCEL: UPDATE unfinished jobs to cancelled, lease bumped, rows locked in id order
job_cancel = job_admin.job_cancel


#: What a retry did (``job_retry_now``): the ids retried, the ids skipped for a held key.
Retried = job_admin.Retried

# --------------------------------------------------------------- maintenance passes


# JOB_REAP_STALE: UPDATE silent workers' jobs, FOR UPDATE SKIP LOCKED, lease bumped
job_reap_stale = reap.job_reap_stale


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


# ROLLUP_MARK_INSERT: INSERT the minute counts' mark row when missing
rollup_mark_insert = rollup.rollup_mark_insert

# ROLLUP_LOCK: lock the mark row FOR UPDATE SKIP LOCKED, one pass at a time
rollup_lock = rollup.rollup_lock

# ROLLUP_MINUTES: UPSERT the minutes, move the mark, under rollup_lock; locks no job row
rollup_minutes = rollup.rollup_minutes


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
