"""Every run of a model job writes a row when it starts and updates it when it ends,
in autocommit from the job's own thread, so a run the worker wrote off (timed out,
cancelled, reaped) still says when its thread really ended. ``claimed`` is the
claim's own ``started_at`` (the database clock), read at the start of the run."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

TABLE = "pgjobs_model_runs"
JOB_TABLE = "django_pgjobs_job"


@dataclass(frozen=True)
class Run:
    job_id: int
    lease: int
    kind: str
    key: str | None
    queue: str
    pid: int
    worker: str  # the worker's id: a restarted worker keeps its pid, not its id
    claimed: float | None
    started: float
    ended: float | None
    finished: bool  # the handler returned normally (not timed out, cancelled, killed)


_COLUMNS = (
    "run text PRIMARY KEY, job_id bigint, lease bigint, kind text, key text, queue text,"
    " pid int, worker text, claimed double precision, started double precision,"
    " ended double precision, finished boolean NOT NULL DEFAULT false"
)


def _sql(statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def create() -> None:
    """The table, empty."""
    _sql(f"CREATE TABLE IF NOT EXISTS {TABLE} ({_COLUMNS})")
    _sql(f"TRUNCATE {TABLE}")


def start(context: Any, kind: str, key: str | None) -> str:
    """Record the start of a run of the job ``context`` (a JobContext) describes."""
    run = uuid.uuid4().hex
    ids = [context.job_id, context.lease]
    _sql(
        f"INSERT INTO {TABLE} (run, job_id, lease, kind, key, queue, pid, worker, started,"
        " claimed) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
        f" (SELECT extract(epoch FROM started_at) FROM {JOB_TABLE}"
        "   WHERE id = %s AND lease = %s))",
        [run, *ids, kind, key, context.queue, os.getpid(), context.worker or "", time.time(), *ids],
    )
    return run


def end(run: str, finished: bool) -> None:
    _sql(
        f"UPDATE {TABLE} SET ended = %s, finished = %s WHERE run = %s",
        [time.time(), finished, run],
    )


def all_runs() -> list[Run]:
    rows = _sql(
        "SELECT job_id, lease, kind, key, queue, pid, worker, claimed, started, ended, finished"
        f" FROM {TABLE} ORDER BY started"
    )
    return [Run(*row) for row in rows]
