"""Events by name and key: the emit (in the caller's transaction, behind a shared lock
on its name and key) and the pruner's batch."""

from __future__ import annotations

from typing import Any

from django_pgjobs.db.tables import EVENT

#: The first key of the two-int advisory locks on an event's (name, key): "pjev".
EVENT_LOCK_SPACE = 0x706A6576

# The lock's second key, from the name and the key (a JSON array tells a NULL key from
# an empty one). Two names that share a hash only share the lock: emits never wait on
# each other (shared), a wait's check waits a moment longer.
_EVENT_LOCK_KEY = "hashtext(json_build_array(%(name)s::text, %(key)s::text)::text)"

# An emit takes the lock shared, in a statement of its own before its insert and held
# until the caller's transaction ends: a wait that checks for the event and then parks
# takes it exclusively around both, so either the wait's check sees the committed
# event, or the emit's insert (a later statement, a later snapshot) sees the parked
# wait and wakes it. Emits of one (name, key) never wait on each other.
EVENT_LOCK_SHARED = f"SELECT pg_advisory_xact_lock_shared({EVENT_LOCK_SPACE}, {_EVENT_LOCK_KEY})"

# Store the event. Returns its id.
EVENT_INSERT = f"""
INSERT INTO {EVENT} (name, key, payload) VALUES (%(name)s, %(key)s, %(payload)s::jsonb)
RETURNING id
"""

# Delete one batch of events older than their retention, oldest first (the created_at
# index), each batch its own short transaction; SKIP LOCKED lets pruners on many hosts
# take disjoint rows. No "--" comment inside: pg_cron runs this text flattened.
EVENT_PRUNE_BATCH = f"""
WITH doomed AS (
    SELECT id FROM {EVENT}
     WHERE created_at < now() - make_interval(secs => %(older_than)s)
     ORDER BY created_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {EVENT} AS e USING doomed WHERE e.id = doomed.id RETURNING e.id
)
SELECT count(*) FROM gone
"""

# Dry run of the above: how many events would go. Reads only.
EVENT_PRUNE_COUNT = f"""
SELECT count(*) FROM {EVENT} WHERE created_at < now() - make_interval(secs => %(older_than)s)
"""


def event_emit(cursor: Any, params: dict[str, Any]) -> int:
    """The shared lock on (name, key), then the insert: two statements of one
    transaction (the caller's). Returns the event's id."""
    cursor.execute(EVENT_LOCK_SHARED, params)
    cursor.execute(EVENT_INSERT, params)
    return int(cursor.fetchone()[0])
