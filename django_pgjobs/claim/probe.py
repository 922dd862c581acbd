"""The claim front's probe: finds the pending jobs before a worker's claim bound that
no NOTIFY announced, so the claims never read the claim index from its start
(``front.py`` says why that read hurt under a held xmin horizon).

One per worker, on its maintenance thread: the bound is the worker's own. A probe that
fails is retried at the next interval like any pass; after ``UNPROBED_AFTER`` seconds
without one the claims sweep again themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections

from django_pgjobs.claim import front as claim_front
from django_pgjobs.claim.front import ClaimFront
from django_pgjobs.conf import get_settings
from django_pgjobs.db.cursor import Connection
from django_pgjobs.db.epoch import epoch_us, from_epoch_us
from django_pgjobs.db.tables import JOB, pending_queues_cte
from django_pgjobs.states import JobStatus

# The oldest pending run_at before the bound, in the worker's queues and (when it
# claims with the known-task filter) of its tasks; then the priorities of the pending
# jobs in scope from the bound (or that oldest job) on, for the claims' seek by level.
#
# ``front`` reads the claim index's entries before the bound and visits each one's
# row: the entries of the jobs claimed since VACUUM last ran, the very walk the bound
# spares the claims. It runs on the maintenance thread's connection
# (``FrontProbe`` below), so no claim waits for it. ``run_at < since`` is an
# index condition (checked on the entries, the live backlog behind the bound costs no
# row visit), as is the queue list; the task filter is checked on the rows the walk
# visits anyway.
#
# ``lv`` is a loose index scan per queue (``qs``: the worker's queues, or those with
# pending jobs from the front on): the highest priority with a pending job at or past
# the front, then the next lower one, one index probe per level found. Each probe steps
# over the dead entries of its level before the front, checked on the entries (no row
# visit). Read-only; no lock.
_TASKS = (
    " AND (%(tasks)s::text[] IS NULL OR array_position(%(tasks)s::text[], task::text) IS NOT NULL)"
)
_PROBE = f"""
WITH RECURSIVE front AS (
    SELECT min(run_at) AS oldest, least(%(since)s::timestamptz, min(run_at)) AS since
      FROM {JOB}
     WHERE status = '{JobStatus.PENDING}' AND run_at < %(since)s{{queues}}{_TASKS}
), {{scope}}, lv(queue, p) AS (
    SELECT qs.name,
           (SELECT priority FROM {JOB}
             WHERE status = '{JobStatus.PENDING}' AND queue = qs.name
               AND run_at >= (SELECT since FROM front){_TASKS}
             ORDER BY priority DESC LIMIT 1)
      FROM qs WHERE qs.name IS NOT NULL
    UNION ALL
    SELECT lv.queue,
           (SELECT priority FROM {JOB}
             WHERE status = '{JobStatus.PENDING}' AND queue = lv.queue AND priority < lv.p
               AND run_at >= (SELECT since FROM front){_TASKS}
             ORDER BY priority DESC LIMIT 1)
      FROM lv WHERE lv.p IS NOT NULL
)
SELECT (SELECT {epoch_us("oldest")} FROM front),
       ARRAY(SELECT DISTINCT p FROM lv WHERE p IS NOT NULL)
"""
#: A worker of every queue.
FRONT_PROBE_ALL = _PROBE.format(
    queues="", scope=pending_queues_cte(" AND run_at >= (SELECT since FROM front)")
)
#: A worker of some queues (``runjobs --queues``).
FRONT_PROBE_QUEUES = _PROBE.format(
    queues=" AND queue = ANY (%(queues)s::text[])",
    scope="qs(name) AS (SELECT unnest(%(queues)s::text[]))",
)


@dataclass(frozen=True)
class Probed:
    """What a probe found: the oldest ``run_at`` of a pending job before the bound
    (None: none), and the priorities of the pending jobs from there on."""

    oldest: datetime | None
    levels: tuple[int, ...]


def front_probe(
    connection: Connection,
    since: datetime,
    queues: Sequence[str] | None,
    tasks: Sequence[str] | None,
) -> Probed:
    """FRONT_PROBE_*: the pending jobs before ``since`` and the priorities in scope."""
    sql = FRONT_PROBE_ALL if queues is None else FRONT_PROBE_QUEUES
    params = {
        "since": since,
        "queues": None if queues is None else list(queues),
        "tasks": None if tasks is None else list(tasks),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return Probed(None, ())
    # as epoch microseconds, like the claim's run_at: aware UTC whatever USE_TZ says
    return Probed(from_epoch_us(row[0]), tuple(sorted(row[1], reverse=True)))


#: What the worker's claims cover: its queues (None: every queue) and, when it claims
#: with the known-task filter, its tasks (None: any task).
Scope = Callable[[], tuple[Sequence[str] | None, Sequence[str] | None]]


class FrontProbe:
    name = "claim front"

    def __init__(
        self,
        *,
        front: ClaimFront,
        scope: Scope,
        alias: str | None = None,
        interval: float | None = None,
    ):
        self.front = front
        self.scope = scope
        self.alias = alias or get_settings().DATABASE
        # Read when made, not imported: the fault suite's workers probe more often.
        self.interval = claim_front.PROBE_EVERY if interval is None else interval

    def run_once(self) -> dict[str, Any]:
        """``since``: the bound probed below (None: none, the next claim reads the
        whole index); ``oldest``: the oldest pending job found before it; ``levels``:
        the priorities of the pending jobs from there on."""
        since, began = self.front.probe_begins()
        if since is None:
            self.front.probed(None, began)
            return {"since": None, "oldest": None, "levels": None}
        queues, tasks = self.scope()
        found = front_probe(connections[self.alias], since, queues, tasks)
        self.front.probed(found.oldest, began, found.levels)
        return {"since": since, "oldest": found.oldest, "levels": list(found.levels)}
