"""The fair claim under flow control: a fair queue whose worker takes the limited claim
(the queue is paused or has ``max_running`` or ``rate``, or a task of the worker has
a concurrency key) still rotates over its fair keys, and every limit holds.

Behind the limited claim's advisory lock, in its transaction (``limited.py``): for
each fair queue in scope, ``JOB_CLAIM_LIMITED_FAIR`` (the fair claim's walk from the
worker's cursor, ``fair.py``, ranked within what the queue and each concurrency key
may still start, locked only then, as the limited claim does), and then the limited
claim of every queue in scope for what is left of the ask (later statements of the
transaction see what the earlier ones claimed, so the counts stay right).

A key takes its turn when its first due job's concurrency key has room: one descent
per key, so a key whose jobs all wait on a busy concurrency key is passed over
without reading its backlog (a key whose first job waits and whose later ones would
not is served once the first can start).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.claim.fair import KNOWN, WALK, Cursor, turn_cte
from django_pgjobs.claim.limited import (
    FLOW_LOCK,
    JOB_CLAIM_LIMITED_ALL,
    JOB_CLAIM_LIMITED_QUEUES,
    allowance_ctes,
    rate_logged,
)
from django_pgjobs.claim.plain import mark_running, task_array
from django_pgjobs.claim.rows import Claimed, from_rows
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import JOB
from django_pgjobs.jobs import registry
from django_pgjobs.states import JobStatus

# The key's first due job in claim order (one descent), eligible when its concurrency
# key (if any) has room.
_HEAD_FREE = f"""(SELECT NOT EXISTS (SELECT 1 FROM busy b
                                  WHERE b.key = h.concurrency_key
                                    AND b.running >= h.concurrency_limit)
            FROM (SELECT j.concurrency_key, j.concurrency_limit FROM {JOB} j
                   WHERE j.status = '{JobStatus.PENDING}' AND j.queue = %(queue)s
                     AND j.fair_key >= r.key AND j.fair_key <= r.key
                     AND j.run_at <= now() AND {KNOWN}
                   ORDER BY j.fair_key, j.priority DESC, j.run_at, j.id
                   LIMIT 1) AS h)"""

# Each key's first due jobs (no lock yet: ranked first, as in the limited claim), at
# most ``allow`` of the queue and ``key_free`` of each concurrency key, in the fair
# order; then locked by id (SKIP LOCKED, status re-checked) and marked running.
_LIMITED_PICK = f"""cand AS (
    SELECT c.*, t.key AS fkey, t.pos, t.w, t.used FROM turn t
    CROSS JOIN LATERAL (
        SELECT l.*, row_number() OVER () AS rank FROM (
            SELECT j.id, j.concurrency_key, j.concurrency_limit FROM {JOB} j
             WHERE j.status = '{JobStatus.PENDING}' AND j.queue = %(queue)s
               AND j.fair_key >= t.key AND j.fair_key <= t.key
               AND j.run_at <= now() AND {KNOWN}
             ORDER BY j.fair_key, j.priority DESC, j.run_at, j.id
             LIMIT t.cap
        ) AS l
    ) AS c
), keyed AS (
    SELECT cand.*, (cand.rank - 1 + cand.used) / cand.w AS round,
           row_number() OVER (PARTITION BY cand.concurrency_key
                              ORDER BY (cand.rank - 1 + cand.used) / cand.w, cand.pos,
                                       cand.rank) AS key_rank,
           cand.concurrency_limit - COALESCE(b.running, 0) AS key_free
      FROM cand LEFT JOIN busy b ON b.key = cand.concurrency_key
), chosen AS (
    SELECT id, fkey AS key, pos, round, (rank - 1 + used) %% w + 1 AS in_turn FROM keyed
     WHERE concurrency_key IS NULL OR key_rank <= key_free
     ORDER BY round, pos, rank
     LIMIT LEAST(%(n)s, (SELECT COALESCE(max(allow), 0) FROM allowance WHERE allow > 0))
), picked AS (
    SELECT j.id FROM {JOB} j JOIN chosen ON chosen.id = j.id
     WHERE j.status = '{JobStatus.PENDING}'
       FOR UPDATE OF j SKIP LOCKED
), claimed AS ({mark_running()}), logged AS (
{rate_logged()})"""

# The limited fair claim of one queue (after FLOW_LOCK, same transaction): the claimed
# rows, each followed by its key, its place, its turn and how much of that turn it is.
JOB_CLAIM_LIMITED_FAIR = f"""
WITH RECURSIVE {WALK},
qs(name) AS (SELECT %(queue)s::text),
{allowance_ctes()},
{turn_cte(_HEAD_FREE)},
{_LIMITED_PICK}
SELECT claimed.*, chosen.key, chosen.pos, chosen.round, chosen.in_turn
  FROM claimed JOIN chosen ON chosen.id = claimed.id
"""
declare("JOB_CLAIM_LIMITED_FAIR", (JobStatus.PENDING, JobStatus.RUNNING))

_EXTRA = 4


def job_claim_limited_fair(
    connection: BaseDatabaseWrapper,
    *,
    worker: str,
    queues: Sequence[str] | None,
    n: int,
    tasks: Sequence[str] | None,
    fair: Sequence[tuple[str, Cursor]],
) -> tuple[list[Claimed], dict[str, Cursor]]:
    """FLOW_LOCK, JOB_CLAIM_LIMITED_FAIR for each of the ``fair`` queues (from its
    cursor), then the limited claim of ``queues`` (None: every queue) for what is left
    of ``n``, in one short transaction. The claimed jobs (the fair ones in their
    order) and each fair queue's cursor after them."""
    names = tuple(tasks) if tasks is not None else tuple(d.name for d in registry.all_definitions())
    base: dict[str, Any] = {"worker": worker, "tasks": task_array(names)}
    claimed: list[Claimed] = []
    cursors: dict[str, Cursor] = {}
    with transaction.atomic(using=connection.alias, savepoint=False), connection.cursor() as db:
        db.execute(FLOW_LOCK)
        for queue, cursor in fair:
            left = n - len(claimed)
            if left <= 0:
                break
            params = {**base, "queue": queue, "n": left, "cursor": cursor.key, "used": cursor.used}
            db.execute(JOB_CLAIM_LIMITED_FAIR, params)
            rows = db.fetchall()
            cursors[queue] = cursor
            if rows:
                order = {r[0]: (r[-2], r[-3], r[-1]) for r in rows}
                last = max(rows, key=lambda r: order[r[0]])
                taken = from_rows([r[:-_EXTRA] for r in rows])
                taken.sort(key=lambda c: order[c.id])
                claimed += taken
                cursors[queue] = Cursor(last[-4], last[-1])
        left = n - len(claimed)
        if left > 0:
            params = {**base, "n": left, "scan": max(4 * left, 64)}
            if queues is None:
                statement = JOB_CLAIM_LIMITED_ALL
            else:
                statement = JOB_CLAIM_LIMITED_QUEUES
                params["queues"] = list(queues)
            db.execute(statement, params)
            claimed += from_rows(db.fetchall())
    return claimed, cursors
