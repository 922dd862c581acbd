"""The wake pass: durable jobs whose wake time came (a sleep's end, a wait's timeout)
go back from waiting to pending, and their queues' workers are told at once, as an
enqueue tells them (``JOB_WAKE_DUE`` of ``db/durable.py``).

Every worker runs it, no leader: the rows are taken ``FOR UPDATE SKIP LOCKED``, so two
passes never wait on each other nor wake a job twice, and a pass reads only the
waiting rows that are due, through their own partial index. A job woken by a signal
or an event is moved by that statement itself; this pass only keeps time.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import job_wake_due

#: Seconds between two passes of one worker: how late a sleep may end, at most.
INTERVAL = 1.0
#: Jobs woken per statement; a pass repeats while it fills a batch, up to ROUNDS.
BATCH = 1000
ROUNDS = 10


class WakePass:
    name = "wakes"
    interval = INTERVAL

    def __init__(self, *, alias: str | None = None):
        self.alias = alias or get_settings().DATABASE

    def run_once(self) -> dict[str, Any]:
        """``woken``: the jobs this pass moved to pending; ``complete``: False when it
        stopped with due jobs left (the thread comes back sooner)."""
        connection = connections[self.alias]
        woken = 0
        for _ in range(ROUNDS):
            moved = job_wake_due(connection, limit=BATCH)
            woken += moved
            if moved < BATCH:
                return {"woken": woken, "complete": True}
        return {"woken": woken, "complete": False}
