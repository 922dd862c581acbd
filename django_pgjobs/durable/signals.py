"""Signals: ``send_signal``, a message to one job stored in the caller's transaction,
and ``wait_for_signal``, the job's side (``context.wait_for_signal``).

Like an enqueue, a signal commits exactly when the caller's own writes do: no
``on_commit``, nothing sent for a rolled-back transaction. A ``wait_for_signal`` of its
name consumes it once, the oldest first; a signal sent before the wait is kept for it.
The send wakes a job parked on that name at commit, through the enqueue's NOTIFY.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness
from django_pgjobs.db.cursor import hot_cursor
from django_pgjobs.db.store import signal_by_key, signal_send, signal_take
from django_pgjobs.durable.payloads import check_name, payload_text
from django_pgjobs.durable.run import DurableRun
from django_pgjobs.durable.waits import Look, Wait, seconds
from django_pgjobs.exceptions import JobFinished, UnknownJob
from django_pgjobs.support.validation import check_key, json_text


def _check_job_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"job_id must be a job's id (int), got {value!r}")
    if not 1 <= value < 2**63:
        raise ValueError(f"job_id must be a positive job id, got {value!r}")
    return value


@readiness.names_the_fix("send_signal")
def send_signal(
    job_id: int,
    name: str,
    payload: Any = None,
    idempotency_key: str | None = None,
    *,
    using: str | None = None,
) -> int:
    """Store signal ``name`` (with a JSON ``payload``) for job ``job_id`` in the current
    transaction, and return the signal's id.

    A second signal with the same ``idempotency_key`` for the same job writes nothing
    and returns the first one's id. Raises ``UnknownJob`` (a ``LookupError``) for an unknown job and
    ``JobFinished`` for a job that has finished (completed, dead or cancelled).
    """
    job_id = _check_job_id(job_id)
    name = check_name(name, "signal")
    key = check_key(idempotency_key, "idempotency_key")
    text = payload_text(payload, "signal")
    alias = using or get_settings().DATABASE
    params = {
        "job_id": job_id,
        "name": name,
        "payload": text,
        "idempotency_key": key,
        "waiting_for": json_text(waiting_for(name)),
    }
    # savepoint=False: inside a caller's atomic() this adds no round trips.
    with (
        transaction.atomic(using=alias, savepoint=False),
        hot_cursor(connections[alias]) as cursor,
    ):
        sent = signal_send(cursor, params)
        if sent is None:
            raise UnknownJob(f"send_signal: there is no job {job_id} (never enqueued, or pruned)")
        status, signal_id = sent
        if signal_id is not None:
            return signal_id
        existing = None if key is None else signal_by_key(cursor, job_id, key)
        if existing is not None:
            return existing
    raise JobFinished(
        f"send_signal: job {job_id} is {status}; a finished job takes no signals "
        "(retry it first if it must go on)"
    )


def wait_for_signal(run: DurableRun, name: str, timeout: Any = None) -> Any:
    """``context.wait_for_signal``: the payload of the oldest unconsumed signal ``name``
    of this job, consumed exactly once (its take and the step that records it commit
    together), or the run parks until one commits or ``timeout`` passes (then None).
    A later run returns what this wait received."""
    name = check_name(name, "signal")
    wait = Wait(run, "signal", name, seconds(timeout, f"wait_for_signal {name!r}: timeout"))
    arrival = wait.arrive()
    done, payload = wait.recorded()
    if done:
        return payload

    def take(cursor: Any) -> Look | None:
        row = signal_take(cursor, job_id=run.job_id, name=name, step=wait.step)
        return None if row is None else Look(*row)

    seen = wait.look(take)
    if seen.found is not None:
        return seen.payload
    if wait.due(arrival):
        wait.timed_out()
        return None
    raise wait.park(arrival, waiting_for(name), seen)


def waiting_for(name: str) -> dict[str, Any]:
    """What a job waiting for signal ``name`` stores on its row (``send_signal`` wakes
    the job whose row says so)."""
    return {"kind": "signal", "name": name}
