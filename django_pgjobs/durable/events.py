"""Events: ``emit_event``, a fact by name and key stored in the caller's transaction,
and ``wait_for_event``, the job's side (``context.wait_for_event``).

For senders that do not know job ids (a webhook: "invoice 42 is paid"): every job
waiting on the event's ``(name, key)`` is woken at commit, and a wait that begins up to
its lookback after the event sees it too (``PGJOBS["EVENT_LOOKBACK"]``). An event is
not consumed: every wait on its (name, key) within its window sees it. Events are
pruned after ``PGJOBS["EVENT_RETENTION"]``. Why no wait misses one: ``db/events.py``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness
from django_pgjobs.db.store import event_emit, event_look
from django_pgjobs.durable.control import RunFenced
from django_pgjobs.durable.payloads import check_name, payload_text
from django_pgjobs.durable.run import DurableRun
from django_pgjobs.durable.waits import Look, Wait, seconds
from django_pgjobs.support.validation import check_key, json_text


@readiness.names_the_fix("emit_event")
def emit_event(
    name: str, key: str | None = None, payload: Any = None, *, using: str | None = None
) -> int:
    """Store event ``name`` for ``key`` (None: the event has no key) with a JSON
    ``payload`` in the current transaction, and return its id."""
    name = check_name(name, "event")
    key = check_key(key, "key")
    params = {
        "name": name,
        "key": key,
        "payload": payload_text(payload, "event"),
        "waiting_for": json_text(waiting_for(name, key)),
    }
    alias = using or get_settings().DATABASE
    # One transaction for the lock and the insert, the caller's when it has one.
    with (
        transaction.atomic(using=alias, savepoint=False),
        connections[alias].cursor() as cursor,
    ):
        return event_emit(cursor, params)


def wait_for_event(
    run: DurableRun, name: str, key: str | None = None, timeout: Any = None, lookback: Any = None
) -> Any:
    """``context.wait_for_event``: the payload of the oldest event ``(name, key)``
    emitted since ``lookback`` (default ``PGJOBS["EVENT_LOOKBACK"]``) before this wait
    first began, or the run parks until one commits or ``timeout`` passes (then None).
    A later run returns what this wait received."""
    name = check_name(name, "event")
    key = check_key(key, "key")
    where = f"wait_for_event {name!r}"
    back = seconds(lookback, f"{where}: lookback")
    retention = get_settings().EVENT_RETENTION
    if back is None:
        back = get_settings().EVENT_LOOKBACK
    elif back > retention:
        raise ValueError(
            f"{where}: lookback {back:,.0f}s is longer than PGJOBS['EVENT_RETENTION'] = "
            f"{retention:,.0f}s; events that old are pruned"
        )
    wait = Wait(run, "event", name, seconds(timeout, f"{where}: timeout"))
    arrival = wait.arrive(lambda now: {"from": (now - timedelta(seconds=back)).isoformat()})
    done, payload = wait.recorded()
    if done:
        return payload
    due = wait.due(arrival)
    params = {
        "job_id": run.job_id,
        "lease": run.lease,
        "name": name,
        "key": key,
        "since": datetime.fromisoformat(arrival["from"]),
        "waiting_for": json_text(waiting_for(name, key)),
        "park": not due,  # a wait that times out now writes nothing on the row
    }

    def look(cursor: Any) -> Look | None:
        row = event_look(cursor, params)
        if row is None:
            return None
        wakes, found, found_payload, ours = row
        if not ours and found is None:
            raise RunFenced(f"job {run.job_id}: lease {run.lease} is no longer current")
        return Look(wakes, found, found_payload)

    seen = wait.look(look)
    if seen.found is not None:
        return seen.payload
    if due:
        wait.timed_out()
        return None
    raise wait.park(arrival, waiting_for(name, key), seen)


def waiting_for(name: str, key: str | None) -> dict[str, Any]:
    """What a job waiting on ``(name, key)`` stores on its row (``emit_event`` wakes
    the jobs whose rows say so)."""
    return {"kind": "event", "name": name, "key": key}
