"""Wake-ups: the NOTIFY that tells idle workers a queue has work (or that the queue rows
changed), and the statements of the worker's LISTEN connection."""

from __future__ import annotations

from django_pgjobs.db.tables import NOTIFY_CHANNEL

# Wake idle workers: after a bulk COPY (one notification per queue per commit), on a
# resume, and with the payload flow.QUEUES_CHANGED when the queue rows changed. A
# single enqueue notifies inside its own statement (JOB_INSERT). Delivered at
# commit, so a rolled-back change wakes nobody.
JOB_NOTIFY = f"SELECT pg_notify('{NOTIFY_CHANNEL}', %s)"

# The worker's LISTEN connection (worker/listener.py, autocommit): subscribe, then a
# keep-alive between waits, which raises on a silently dead connection.
LISTEN = f"LISTEN {NOTIFY_CHANNEL}"
LISTEN_KEEPALIVE = "SELECT 1"
