"""``emit_event``: an event by name and key, stored in the caller's transaction.

For senders that do not know job ids (a webhook: "invoice 42 is paid"): every job
waiting on the event's ``(name, key)`` sees it, and so does a wait that begins up to
its lookback after it (``PGJOBS["EVENT_LOOKBACK"]``). Events are pruned after
``PGJOBS["EVENT_RETENTION"]``.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness
from django_pgjobs.db.events import event_emit
from django_pgjobs.durable.payloads import check_name, payload_text
from django_pgjobs.support.validation import check_key


@readiness.names_the_fix("emit_event")
def emit_event(
    name: str, key: str | None = None, payload: Any = None, *, using: str | None = None
) -> int:
    """Store event ``name`` for ``key`` (None: the event has no key) with a JSON
    ``payload`` in the current transaction, and return its id."""
    name = check_name(name, "event")
    key = check_key(key, "key")
    params = {"name": name, "key": key, "payload": payload_text(payload, "event")}
    alias = using or get_settings().DATABASE
    # One transaction for the lock and the insert, the caller's when it has one.
    with (
        transaction.atomic(using=alias, savepoint=False),
        connections[alias].cursor() as cursor,
    ):
        return event_emit(cursor, params)
