"""Durable jobs' statements: a job's recorded steps (read, record under the lease), the
park of a run (running -> waiting, conditional on ``wakes``), the wake pass (waiting
rows whose time came -> pending) and the clock a test moves (``run_jobs(advance=)``).

Locks: ``STEP_RECORD`` and ``JOB_PARK`` lock the one job row they are about, by
primary key (``FOR NO KEY UPDATE``, the lock the heartbeat and the outcome writes
take, and what a reaper's or a cancel's ``UPDATE`` waits for), so a lease that is
ours when the statement runs stays ours until its transaction ends. ``JOB_WAKE_DUE``
takes waiting rows ``FOR UPDATE SKIP LOCKED`` in wake-time order: two workers'
passes never wait on each other, and a row a run is parking is left to the next pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_pgjobs.db.cursor import Connection, atomic, hot_cursor, json_value
from django_pgjobs.db.job_signals import SIGNAL_PARK_TRY
from django_pgjobs.db.moves import declare
from django_pgjobs.db.notify import due_payload
from django_pgjobs.db.tables import JOB, NOTIFY_CHANNEL, SIGNAL, STEP, by_id_is
from django_pgjobs.states import JobStatus

RUNNING, WAITING, PENDING = JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PENDING

#: A park without a time limit (a wait with no timeout): the job's run_at, far
#: enough to never come and near enough that every client decodes it as a datetime
#: in any time zone ('infinity' does not decode).
NO_LIMIT = "2999-12-31 00:00:00+00"

# A job's history, read once per run at its first durable call: the job's wake
# counter, the database's clock (clock_timestamp(), the clock JOB_WAKE_DUE keeps:
# inside a test's transaction now() stands still), and every recorded step in order, with the results
# of up to %(inline)s bytes (most steps: a replay then costs no round trip; a larger
# one is read when asked for, STEP_RECORDED). No lock: while a run holds the lease
# only that run records steps of its job.
STEP_HISTORY = f"""
SELECT j.wakes, clock_timestamp(), s.seq, s.name, s.occurrence, s.kind,
       CASE WHEN pg_column_size(s.result) <= %(inline)s THEN s.result END,
       COALESCE(pg_column_size(s.result) <= %(inline)s, true)
  FROM {JOB} j LEFT JOIN {STEP} s ON s.job_id = j.id
 WHERE j.id = %(id)s
 ORDER BY s.seq
"""

# One recorded step by its key (no lock).
STEP_RECORDED = f"""
SELECT seq, kind, result FROM {STEP}
 WHERE job_id = %(id)s AND name = %(name)s AND occurrence = %(occurrence)s
"""

# Record a step under the lease: the job row is locked while it is still the
# running row of this lease (a zombie finds no row and records nothing), and the
# step takes the next position of the job's history. Run in the caller's
# transaction: an atomic step's writes, this lock and the step commit together, and
# a reaper's or a cancel's lease bump waits for that commit (or went first, and then
# the step is not written). The next position is read under the row lock; only the
# run holding the lease writes its job's steps, so no two writers race for it (the
# unique (job, seq) would refuse the second). Returns (ours, seq): seq NULL when
# the key was recorded already.
STEP_RECORD = f"""
WITH j AS (
    SELECT id FROM {JOB}
     WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(RUNNING)}
       FOR NO KEY UPDATE
), ins AS (
    INSERT INTO {STEP} (job_id, seq, name, occurrence, kind, result, created_at)
    SELECT j.id, (SELECT COALESCE(max(s.seq) + 1, 0) FROM {STEP} s WHERE s.job_id = j.id),
           %(name)s, %(occurrence)s, %(kind)s, %(result)s::jsonb, now()
      FROM j
    ON CONFLICT DO NOTHING
    RETURNING seq
)
SELECT EXISTS (SELECT 1 FROM j), (SELECT seq FROM ins)
"""

# Park a run: the job leaves its worker until %(until)s (NULL: no time limit), the
# attempt not counted (the claim counted it: given back, as a release does).
#
# Why a wake is never lost. A waker that wakes a running job (an event's emit, which
# finds the row by the ``waiting_for`` its wait's look wrote) bumps ``wakes`` in its
# own transaction, and the run read ``wakes`` (%(seen)s) in the same snapshot as its
# last look. This UPDATE locks the row; if a waker's transaction holds it, the UPDATE
# waits for that commit, and READ COMMITTED then re-evaluates the row's new version
# (the CASEs read the committed ``wakes``). A signal's send locks no running row
# (``db/job_signals.py``): the park of a signal wait runs after SIGNAL_PARK_TRY in
# its transaction, and %(free)s is what that got. Not free: a send to this job is in
# flight, and the job goes back to pending (its next run's look waits for that send).
# Free: every earlier send has committed, and ``signal`` (this statement's snapshot,
# taken after the lock) finds an unconsumed signal of the wait's name, if one came
# after the look. So a wake that committed after the run's look is seen here, however
# close, and the job goes back to pending, due now, instead of waiting; a wake that
# commits after this statement finds the row waiting and moves it itself. The NOTIFY
# of a job that stays pending wakes a worker at commit.
#
# A redo of this write (its reply was lost) recognises its committed self: every
# claim moves the lease on, so a waiting or pending row still at our lease is one
# we parked (a cancel bumps the lease too).
_WOKEN = "(wakes <> %(seen)s OR (SELECT came FROM signal))"
JOB_PARK = f"""
WITH signal AS (
    SELECT NOT %(free)s OR EXISTS (
        SELECT 1 FROM {SIGNAL} s
         WHERE s.job_id = %(id)s AND s.consumed_at IS NULL
           AND s.name = %(waiting_for)s::jsonb->>'name'
           AND %(waiting_for)s::jsonb->>'kind' = 'signal') AS came
), upd AS (
    UPDATE {JOB}
       SET status = CASE WHEN {_WOKEN} THEN '{PENDING}' ELSE '{WAITING}' END,
           run_at = CASE WHEN {_WOKEN} THEN now()
                         ELSE COALESCE(%(until)s::timestamptz, '{NO_LIMIT}') END,
           waiting_for = CASE WHEN {_WOKEN} THEN NULL ELSE %(waiting_for)s::jsonb END,
           attempts = attempts - 1,
           suspect = false
     WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(RUNNING)}
    RETURNING id, status, queue, priority, run_at
), told AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', {due_payload("queue", "run_at", "priority")})
      FROM upd WHERE status = '{PENDING}'
)
SELECT status FROM upd WHERE (SELECT count(*) FROM told) >= 0
UNION ALL
SELECT status FROM {JOB}
 WHERE id = %(id)s AND lease = %(lease)s AND {by_id_is(WAITING, PENDING)}
"""
declare("JOB_PARK", (RUNNING, WAITING), (RUNNING, PENDING))

# The wake pass (maintenance/wakes.py, every worker, no leader): waiting rows whose
# time came go back to pending, a batch at a time, through the partial index on
# waiting rows (pgjobs_job_waiting_idx), and each queue's workers are told at commit,
# as an enqueue tells them. ``wakes`` is bumped like every wake's. The time is the
# wall clock, read once (a scalar subquery: an index bound, where a volatile call
# would be a filter on every waiting row); in autocommit it is now(), and inside a
# test's transaction, where now() stands still, a woken row's run_at is brought back
# to now() so the claim takes it.
JOB_WAKE_DUE = f"""
WITH due AS (
    SELECT id FROM {JOB}
     WHERE status = '{WAITING}' AND run_at <= (SELECT clock_timestamp())
     ORDER BY run_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), woken AS (
    UPDATE {JOB} AS j
       SET status = '{PENDING}', waiting_for = NULL, wakes = j.wakes + 1,
           run_at = LEAST(j.run_at, now())
      FROM due WHERE j.id = due.id
    RETURNING j.id, j.queue, j.priority, j.run_at
), told AS (
    SELECT DISTINCT ON (queue, priority)
           pg_notify('{NOTIFY_CHANNEL}', {due_payload("queue", "run_at", "priority")})
      FROM woken ORDER BY queue, priority, run_at
)
SELECT count(*) FROM woken WHERE (SELECT count(*) FROM told) >= 0
"""
declare("JOB_WAKE_DUE", (WAITING, PENDING))

# Wake now (the admin's action): the selected waiting jobs back to pending, due now,
# locked in id order (the one lock order of every multi-row write); a sleep they
# recorded ends now, so the next run passes it, and a wait looks again. ``wakes`` is
# bumped like every wake's, and the queues' workers are told at commit.
JOB_WAKE_NOW = f"""
WITH mine AS (
    SELECT id FROM {JOB}
     WHERE id = ANY(%(ids)s::bigint[]) AND {by_id_is(WAITING)}
     ORDER BY id
       FOR NO KEY UPDATE
), woken AS (
    UPDATE {JOB} AS j
       SET status = '{PENDING}', run_at = now(), waiting_for = NULL, wakes = j.wakes + 1
      FROM mine WHERE j.id = mine.id
    RETURNING j.id, j.queue, j.priority, j.run_at
), ended AS (
    UPDATE {STEP} AS s
       SET result = jsonb_set(s.result, '{{until}}', to_jsonb(now()))
      FROM woken WHERE s.job_id = woken.id AND s.kind = 'sleep'
       AND (s.result->>'until')::timestamptz > now()
    RETURNING s.id
), told AS (
    SELECT DISTINCT ON (queue, priority)
           pg_notify('{NOTIFY_CHANNEL}', {due_payload("queue", "run_at", "priority")})
      FROM woken ORDER BY queue, priority
)
SELECT id FROM woken WHERE (SELECT count(*) FROM told) + (SELECT count(*) FROM ended) >= 0
"""
declare("JOB_WAKE_NOW", (WAITING, PENDING))

# testing.run_jobs(advance=): a waiting job's clock moved forward by %(secs)s
# seconds: its wake time, and the wake time its sleeps and its waits' timeouts
# recorded, that much earlier.
# A test helper (no lock order to keep: a test drives one job at a time).
JOB_ADVANCE_WAITING = f"""
WITH moved AS (
    UPDATE {JOB} SET run_at = run_at - make_interval(secs => %(secs)s)
     WHERE status = '{WAITING}' AND run_at < '{NO_LIMIT}'
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
    RETURNING id
), sleeps AS (
    UPDATE {STEP} AS s
       SET result = jsonb_set(s.result, '{{until}}', to_jsonb(
               (s.result->>'until')::timestamptz - make_interval(secs => %(secs)s)))
      FROM moved WHERE s.job_id = moved.id AND s.kind IN ('sleep', 'signal', 'event')
       AND jsonb_typeof(s.result->'until') = 'string'
    RETURNING s.id
)
SELECT count(*) FROM moved WHERE (SELECT count(*) FROM sleeps) >= 0
"""


@dataclass(frozen=True)
class StepRow:
    """One recorded step: its position, key, kind and (when ``inline``) result."""

    seq: int
    name: str
    occurrence: int
    kind: str
    result: Any
    inline: bool = True


@dataclass(frozen=True)
class History:
    """What STEP_HISTORY read: the job's ``wakes``, the database's clock, its steps."""

    wakes: int
    now: datetime
    steps: tuple[StepRow, ...]


def step_history(connection: Connection, job_id: int, *, inline: int = 8192) -> History | None:
    """STEP_HISTORY: the job's history (None: no such job)."""
    with hot_cursor(connection) as cursor:
        cursor.execute(STEP_HISTORY, {"id": job_id, "inline": inline})
        rows = cursor.fetchall()
    if not rows:
        return None
    steps = tuple(
        StepRow(r[2], r[3], r[4], r[5], json_value(r[6]), bool(r[7]))
        for r in rows
        if r[2] is not None
    )
    return History(int(rows[0][0]), rows[0][1], steps)


def step_recorded(
    connection: Connection, job_id: int, name: str, occurrence: int
) -> StepRow | None:
    """STEP_RECORDED: the step recorded under (job, name, occurrence), or None."""
    with hot_cursor(connection) as cursor:
        cursor.execute(STEP_RECORDED, {"id": job_id, "name": name, "occurrence": occurrence})
        row = cursor.fetchone()
    return None if row is None else StepRow(row[0], name, occurrence, row[1], json_value(row[2]))


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
    """STEP_RECORD: INSERT a step (``result``: its JSON text) under the job row's
    ``FOR NO KEY UPDATE`` lock, fenced by ``lease``; ``(ours, seq)``: ours False when
    the lease was no longer ours (nothing written), seq None when the key was recorded
    already."""
    params = {
        "id": job_id,
        "lease": lease,
        "name": name,
        "occurrence": occurrence,
        "kind": kind,
        "result": result,
    }
    with hot_cursor(connection) as cursor:
        cursor.execute(STEP_RECORD, params)
        ours, seq = cursor.fetchone()
    return bool(ours), seq


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
    """JOB_PARK: UPDATE a durable run to waiting, the one row, lease-fenced
    (``waiting_for``: JSON text; ``signal``: a wait for a signal, whose park first tries
    the job's signal lock, in one transaction with it); the status it gave the row
    ("waiting", or "pending" when a wake came meanwhile), None when the lease was no
    longer ours."""
    params = {
        "id": id,
        "job_id": id,
        "lease": lease,
        "until": until,
        "waiting_for": waiting_for,
        "seen": seen,
        "free": True,
    }
    if not signal:
        return _park(connection, params)
    with atomic(connection):
        with hot_cursor(connection) as cursor:
            cursor.execute(SIGNAL_PARK_TRY, params)
            params["free"] = bool(cursor.fetchone()[0])
        return _park(connection, params)


def _park(connection: Connection, params: dict[str, Any]) -> str | None:
    with hot_cursor(connection) as cursor:
        cursor.execute(JOB_PARK, params)
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def job_wake_due(connection: Connection, *, limit: int = 1000) -> int:
    """JOB_WAKE_DUE: UPDATE up to ``limit`` due waiting jobs to pending, ``FOR UPDATE
    SKIP LOCKED``; how many."""
    with hot_cursor(connection) as cursor:
        cursor.execute(JOB_WAKE_DUE, {"limit": limit})
        return int(cursor.fetchone()[0])


def job_wake_now(connection: Connection, ids: Sequence[int]) -> set[int]:
    """JOB_WAKE_NOW: UPDATE the waiting jobs of ``ids`` to pending now, rows locked in id
    order; the ids woken."""
    with hot_cursor(connection) as cursor:
        cursor.execute(JOB_WAKE_NOW, {"ids": list(ids)})
        return {int(row[0]) for row in cursor.fetchall()}


def job_advance_waiting(
    connection: Connection, seconds: float, queues: Sequence[str] | None = None
) -> int:
    """JOB_ADVANCE_WAITING: UPDATE waiting jobs' clocks ``seconds`` forward
    (``run_jobs(advance=)`` only); how many."""
    with hot_cursor(connection) as cursor:
        cursor.execute(
            JOB_ADVANCE_WAITING,
            {"secs": seconds, "queues": None if queues is None else list(queues)},
        )
        return int(cursor.fetchone()[0])
