"""The rollup pass: count finished jobs into per-minute rows (``db/rollup.py``), so the
overview, its charts and ``jobs_status`` read minutes, not jobs.

Every ``runjobs`` runs a pass every ``INTERVAL`` seconds; no leader: a pass takes the
mark row with ``SKIP LOCKED``, so one counts and the others skip. A pass counts the jobs
finished since the mark, through the ``finished_at`` index, in steps of at most
``STEP`` (a first pass, or one after a long pause, catches up step by step within its
time budget), and forgets minutes older than ``RETENTION``. The first pass starts
``BACKFILL`` back, the longest window a page reads (the overview's "dead-lettered,
last 24 h").
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db.cursor import Connection, atomic
from django_pgjobs.db.store import rollup_lock, rollup_mark_insert, rollup_minutes

#: Seconds between two passes of one worker.
INTERVAL = 5.0
#: How long minute rows are kept.
RETENTION = timedelta(days=2)
#: How far back the first pass starts.
BACKFILL = timedelta(days=1)
#: The longest stretch of finishes one statement counts.
STEP = timedelta(minutes=10)


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


class Rollup:
    name = "rollup"
    interval = INTERVAL

    def __init__(self, *, alias: str | None = None, time_budget: float | None = 1.0):
        self.alias = alias or get_settings().DATABASE
        self.time_budget = time_budget

    def run_once(self) -> dict[str, Any]:
        """Steps until caught up (or out of time). ``caught_up``: the mark is within a
        step of the present; ``counted``: jobs added to the minutes; ``skipped``:
        another pass held the mark."""
        started = time.monotonic()
        counted = 0
        while True:
            step = self._step()
            if step is None:
                return {"counted": counted, "caught_up": False, "skipped": True}
            n, caught_up = step
            counted += n
            if caught_up or (
                self.time_budget is not None and time.monotonic() - started > self.time_budget
            ):
                return {"counted": counted, "caught_up": caught_up, "skipped": False}

    def _step(self) -> tuple[int, bool] | None:
        connection = connections[self.alias]
        step = self._locked_step(connection)
        if step is None:
            # No row to lock: missing, or another pass holds it. The insert is a
            # transaction of its own (autocommit), never part of the pass's: a worker
            # frozen (SIGSTOP) inside its first pass held the new row's key uncommitted,
            # and every other worker's insert waited on it, with their reapers.
            rollup_mark_insert(connection)
            step = self._locked_step(connection)  # None: another pass holds it
        return step

    def _locked_step(self, connection: Connection) -> tuple[int, bool] | None:
        """One step in a transaction that holds the mark, or None without a mark."""
        with atomic(connection):
            mark = rollup_lock(connection)
            return None if mark is None else self._count(connection, mark)

    def _count(
        self,
        connection: Connection,
        mark: tuple[datetime | None, datetime | None, datetime, datetime],
    ) -> tuple[int, bool]:
        """One step inside the transaction holding the mark: count, move the mark."""
        rolled_from, rolled_to, now, settled = mark
        start = _minute(now - BACKFILL)
        if rolled_to is None or rolled_from is None:
            rolled_from = rolled_to = start
        since = rolled_to
        until = max(since, min(settled, since + STEP))
        # Minutes before keep_from go; never a minute this step writes (>= since's).
        keep_from = max(rolled_from, min(_minute(now - RETENTION), _minute(since)))
        n = rollup_minutes(connection, since=since, until=until, keep_from=keep_from)
        return n, until >= settled
