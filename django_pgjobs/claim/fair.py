"""The fair claim: within one queue, claims go round-robin across the fair keys that
have due jobs (``@job(fair_key=...)``), each key taking its weight's worth of jobs a
turn (``Queue.weights``, 1 when not named), priority ordering the jobs within a key.

One statement, one round trip, and nothing in it grows with a key's backlog:

* the keys are walked in key order from the worker's rotation cursor (a loose index
  scan of the fair index ``(queue, fair_key, priority DESC, run_at, id) WHERE status =
  'pending' AND fair_key IS NOT NULL``: one descent per key), wrapping round to the
  first key, lazily, until ``n`` keys with a due job are found (a claim of n jobs
  never needs more);
* each of those keys gives its first few due jobs (a LATERAL range scan of its part
  of the index, ``FOR UPDATE SKIP LOCKED``, as many as its turns in this claim can
  take);
* those are ranked by turn (the job's rank within its key divided by the key's
  weight), then by the key's place after the cursor, and the first ``n`` are marked
  running by the plain claim's ``UPDATE`` (fenced by the lease it bumps). The rows of
  the scans that are not taken stay locked only for this statement.

The cursor (the key of the last job taken, and how many of its turn it used) is kept
by the worker (``FairCursors``), not in a table: no claim writes anything but the
claimed rows, and two workers never wait for each other. Each worker rotates on its
own, so a key waits at most one rotation of any worker, whatever another key's
backlog. Chosen over a per-key table with a served counter (a write to that row by
every claim, which serialised the workers' claims of a queue) and over walking every
key per claim (a cost per claim that grew with the number of keys): see
docs/explanation/performance.md.

A job without a fair key in a fair queue gets the key ``""`` at enqueue (``enqueue.py``),
so it takes its turn with the keyed ones; a row written without one (by SQL) is left
to the plain claim, which the worker runs for what a fair claim left of its ask.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_pgjobs.claim.plain import mark_running, task_array
from django_pgjobs.claim.rows import Claimed, from_rows
from django_pgjobs.db.cursor import Connection, hot_cursor
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import JOB, QUEUE
from django_pgjobs.states import JobStatus

_PENDING_KEYED = f"status = '{JobStatus.PENDING}' AND fair_key IS NOT NULL AND queue = %(queue)s"
# A job of a task this worker knows (NULL: any task; deploy skew, see claimant.py).
KNOWN = "(%(tasks)s::text[] IS NULL OR array_position(%(tasks)s::text[], j.task::text) IS NOT NULL)"

# ``after``: the keys from the cursor on (the cursor's own first: it may have turns
# left); ``before``: from the first key up to the cursor (the wrap). Each step is one
# descent of the fair index (no lock). Both are read lazily: the LIMIT of ``turn``
# stops the walk once it has n keys with a due job. ``part`` and ``step`` are the
# key's place in the rotation.
WALK = f"""after(key, step) AS (
    (SELECT fair_key, 0 FROM {JOB}
      WHERE {_PENDING_KEYED} AND fair_key >= %(cursor)s ORDER BY fair_key LIMIT 1)
    UNION ALL
    SELECT (SELECT fair_key FROM {JOB}
             WHERE {_PENDING_KEYED} AND fair_key > a.key ORDER BY fair_key LIMIT 1), a.step + 1
      FROM after a WHERE a.key IS NOT NULL
), before(key, step) AS (
    (SELECT fair_key, 0 FROM {JOB}
      WHERE {_PENDING_KEYED} AND fair_key < %(cursor)s ORDER BY fair_key LIMIT 1)
    UNION ALL
    SELECT (SELECT fair_key FROM {JOB}
             WHERE {_PENDING_KEYED} AND fair_key > b.key AND fair_key < %(cursor)s
             ORDER BY fair_key LIMIT 1), b.step + 1
      FROM before b WHERE b.key IS NOT NULL
)"""

# A key with a due job of a known task (one descent of its part of the index).
DUE_KEY = f"""EXISTS (SELECT 1 FROM {JOB} j
                        WHERE j.status = '{JobStatus.PENDING}' AND j.queue = %(queue)s
                          AND j.fair_key = r.key AND j.run_at <= now() AND {KNOWN})"""


def turn_cte(eligible: str) -> str:
    """The CTE ``turn``, the keys of this claim: the first n + 1 of the rotation for
    which ``eligible`` (a condition on ``r.key``) holds (the cursor's key, first, may
    have used its turn), each with its weight (the queue row's, 1 when not named),
    the jobs of its turn it took already (the cursor's key: ``used``) and how many
    jobs its scan may take (its turns in a claim of n, at most n). No lock."""
    return f"""turn AS MATERIALIZED (
    SELECT k.key, k.pos, k.w, k.used,
           LEAST(%(n)s, k.w * ceil(%(n)s::numeric / sum(k.w) OVER ())::int + k.used) AS cap
      FROM (
        SELECT r.key, r.pos,
               COALESCE((SELECT (q.weights ->> r.key)::int FROM {QUEUE} q
                          WHERE q.name = %(queue)s), 1) AS w,
               CASE WHEN r.key = %(cursor)s THEN %(used)s ELSE 0 END AS used
          FROM (SELECT key, step AS pos FROM after WHERE key IS NOT NULL
                UNION ALL
                SELECT key, 1000000000 + step FROM before WHERE key IS NOT NULL) AS r
         WHERE {eligible}
         LIMIT %(n)s + 1
      ) AS k
)"""


# Each key's first due jobs in claim order, locked as they are read (SKIP LOCKED: a
# row another claim holds is passed over, and the scan goes on to the next), and
# numbered within the key as they come. The key is matched as a range of one value,
# ordered by it: only the fair index gives that order without a sort, so the planner
# never reads one key's jobs through the claim index, past every other key's (it
# did, with ``fair_key = t.key``, for a queue whose statistics saw one key).
# Ranked by turn, then by the key's place, then within the key; the first n are
# claimed. ``used`` shifts the cursor's key: its first job belongs to the turn it
# was in.
_PICK = f"""cand AS (
    SELECT c.id, c.rank, t.key, t.pos, t.w, t.used FROM turn t
    CROSS JOIN LATERAL (
        SELECT l.id, row_number() OVER () AS rank FROM (
            SELECT j.id FROM {JOB} j
             WHERE j.status = '{JobStatus.PENDING}' AND j.queue = %(queue)s
               AND j.fair_key >= t.key AND j.fair_key <= t.key
               AND j.run_at <= now() AND {KNOWN}
             ORDER BY j.fair_key, j.priority DESC, j.run_at, j.id
             LIMIT t.cap
               FOR UPDATE OF j SKIP LOCKED
        ) AS l
    ) AS c
), picked AS (
    SELECT id, key, pos, (rank - 1 + used) / w AS round, (rank - 1 + used) %% w + 1 AS in_turn
      FROM cand
     ORDER BY (rank - 1 + used) / w, pos, rank
     LIMIT %(n)s
)"""

# The fair claim of one queue: the claimed rows (as the plain claim returns them),
# each followed by its key, its place, its turn and how much of that turn it is.
JOB_CLAIM_FAIR = f"""
WITH RECURSIVE {WALK},
{turn_cte(DUE_KEY)},
{_PICK},
claimed AS ({mark_running()})
SELECT claimed.*, picked.key, picked.pos, picked.round, picked.in_turn
  FROM claimed JOIN picked ON picked.id = claimed.id
"""
declare("JOB_CLAIM_FAIR", (JobStatus.PENDING, JobStatus.RUNNING))

# The queues claimed fairly as far as the rows say: those with a keyed pending job
# (a loose index scan of the fair index: one descent per such queue, none when no
# job has a key) and those with weights. Read-only.
FAIR_QUEUES = f"""
WITH RECURSIVE fq(name) AS (
    (SELECT queue FROM {JOB} WHERE status = '{JobStatus.PENDING}' AND fair_key IS NOT NULL
      ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM {JOB}
             WHERE status = '{JobStatus.PENDING}' AND fair_key IS NOT NULL AND queue > fq.name
             ORDER BY queue LIMIT 1)
      FROM fq WHERE fq.name IS NOT NULL
)
SELECT name FROM fq WHERE name IS NOT NULL
UNION
SELECT name FROM {QUEUE} WHERE weights IS NOT NULL AND weights <> '{{}}'::jsonb
"""

#: Columns JOB_CLAIM_FAIR returns after the plain claim's.
_EXTRA = 4


@dataclass(frozen=True)
class Cursor:
    """Where a worker's rotation of one queue stands: the key of the last job it
    took, and how many jobs of that key's turn it has taken."""

    key: str = ""
    used: int = 0


class FairCursors:
    """One worker's rotation cursors, per queue (the claim loop's thread writes them;
    the lock keeps a reader in another thread whole)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cursors: dict[str, Cursor] = {}

    def get(self, queue: str) -> Cursor:
        with self._lock:
            return self._cursors.get(queue, Cursor())

    def set(self, queue: str, cursor: Cursor) -> None:
        with self._lock:
            self._cursors[queue] = cursor


def job_claim_fair(
    connection: Connection,
    *,
    worker: str,
    queue: str,
    n: int,
    cursor: Cursor,
    tasks: Sequence[str] | None = None,
) -> tuple[list[Claimed], Cursor]:
    """JOB_CLAIM_FAIR: up to ``n`` due jobs of ``queue``, round-robin over its fair keys
    from ``cursor``; the claimed jobs in that order, and the cursor after them."""
    params: dict[str, Any] = {
        "worker": worker,
        "queue": queue,
        "n": n,
        "cursor": cursor.key,
        "used": cursor.used,
        "tasks": None if tasks is None else task_array(tuple(tasks)),
    }
    with hot_cursor(connection) as db:
        db.execute(JOB_CLAIM_FAIR, params)
        rows = db.fetchall()
    if not rows:
        return [], cursor
    # (turn, place after the cursor, place in the turn): the order they were chosen in
    order = {r[0]: (r[-2], r[-3], r[-1]) for r in rows}
    last = max(rows, key=lambda r: order[r[0]])
    claimed = from_rows([r[:-_EXTRA] for r in rows])
    claimed.sort(key=lambda c: order[c.id])
    return claimed, Cursor(last[-4], last[-1])


def fair_queues(connection: Connection) -> list[str]:
    """The rows of FAIR_QUEUES: the queues with a keyed pending job or with weights."""
    with hot_cursor(connection) as db:
        db.execute(FAIR_QUEUES)
        return sorted(row[0] for row in db.fetchall())
