"""A job's error history in SQL: the shape of one entry, the bound on how many are kept,
the dead-letter sweeps' update that records one, and an entry written by Python turned
into a statement's parameters."""

from __future__ import annotations

import json
from typing import Any

from django_pgjobs.conf import get_settings
from django_pgjobs.db.tables import JOB
from django_pgjobs.states import JobStatus


def errors_kept() -> int:
    """``PGJOBS["MAX_ERRORS_KEPT"]``: the ``%(keep)s`` of ``keep_newest``."""
    return get_settings().MAX_ERRORS_KEPT


def keep_newest(array: str, keep: str = "%(keep)s") -> str:
    """SQL for the jsonb array ``array`` cut to its ``keep`` newest entries (a parameter:
    ``PGJOBS["MAX_ERRORS_KEPT"]``, see ``errors_kept``): the error history of a job stays
    bounded however often it fails, is reclaimed or retried."""
    return (
        f"jsonb_path_query_array({array}, 'lax $[last - $n + 1 to last]', "
        f"jsonb_build_object('n', {keep}::int))"
    )


def error_entry(
    *,
    type: str,
    message: str,
    worker: str,
    refunded: str | None = None,
    isolated: str | None = None,
) -> str:
    """SQL for a one-entry jsonb array: the error entry of the attempt of row ``j`` that
    a statement (not a worker) records — the reaper, the dead-letter sweeps. The keys
    of the Python entry (``worker/executor.py``), with no traceback; ``refunded``: the
    reaper's mark that the attempt was given back; ``isolated``: its mark that the lost
    run was a suspect's, running alone in its own process."""
    refund = "" if refunded is None else f", 'refunded', {refunded}"
    if isolated is not None:
        refund += f", 'isolated', {isolated}"
    return f"""jsonb_build_array(jsonb_build_object(
    'attempt', j.attempts, 'at', now(), 'type', {type}, 'message', {message},
    'traceback', NULL, 'worker', {worker}{refund}))"""


def dead_letter(selected: str, *, type: str, message: str, worker: str, last_error: str) -> str:
    """SQL that dead-letters the rows whose ids the CTE ``selected`` picked (pending rows
    it locked ``FOR UPDATE SKIP LOCKED``): the end of the sweeps that move pending rows
    to dead (attempts used up, ``db/job_outcome.py``; unknown task, ``db/workers.py``).
    The lease is bumped; the entry is ``error_entry``'s; returns (id, task)."""
    entry = error_entry(type=type, message=message, worker=worker)
    return f"""UPDATE {JOB} AS j
   SET status = '{JobStatus.DEAD}', finished_at = now(), lease = j.lease + 1,
       errors = j.errors || {entry},
       last_error = {last_error}
  FROM {selected}
 WHERE j.id = {selected}.id
RETURNING j.id, j.task"""


def error_params(error: dict[str, Any]) -> dict[str, Any]:
    """The error entry to append, the parts that make it unique (``mark``, for
    recognising our own earlier committed write; NULL when it has no ``at``), and the
    chunk run the attempt ran in (``chunk_run``: the failed-attempt writes record it
    on the row, jobs/chunk_schema.py; NULL for a run alone)."""
    mark = None
    if error.get("at") is not None:
        mark = json.dumps([{k: error.get(k) for k in ("attempt", "at", "worker")}])
    attempt = error.get("attempt")
    return {
        "error": json.dumps([error]),
        "last_error": last_error(error),
        "mark": mark,
        "attempt": attempt if isinstance(attempt, int) else None,
        "keep": errors_kept(),
        "chunk_run": error.get("chunk_run"),
    }


def last_error(error: dict[str, Any]) -> str:
    """``last_error`` of a row: ``"<type>: <message>"`` of its newest entry."""
    return f"{error.get('type', 'Error')}: {error.get('message', '')}"[:10000]
