"""The claim front's probe: is there a pending job before a worker's bound that no
NOTIFY announced? (``claim_front.py`` says why the claims start at a bound.)"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django_pgjobs.db.cursor import Connection
from django_pgjobs.db.tables import JOB
from django_pgjobs.states import JobStatus

# The oldest pending run_at before the bound, in the worker's queues and (when it
# claims with the known-task filter) of its tasks. It reads the claim index's entries
# before the bound and visits each one's row: the entries of the jobs claimed since
# VACUUM last ran, the very walk the bound spares the claims. It runs on the
# maintenance thread's connection (maintenance/front_probe.py), so no claim waits for
# it. ``run_at < since`` is an index condition (checked on the entries, the live
# backlog behind the bound costs no row visit), as is the queue list; the task filter
# is checked on the rows the walk visits anyway. Read-only; no lock.
_PROBE = f"""
SELECT min(run_at) FROM {JOB}
 WHERE status = '{JobStatus.PENDING}' AND run_at < %(since)s{{queues}}
   AND (%(tasks)s::text[] IS NULL OR array_position(%(tasks)s::text[], task::text) IS NOT NULL)
"""
#: A worker of every queue.
FRONT_PROBE_ALL = _PROBE.format(queues="")
#: A worker of some queues (``runjobs --queues``).
FRONT_PROBE_QUEUES = _PROBE.format(queues=" AND queue = ANY (%(queues)s::text[])")


def front_probe(
    connection: Connection,
    since: datetime,
    queues: Sequence[str] | None,
    tasks: Sequence[str] | None,
) -> datetime | None:
    """FRONT_PROBE_*: the oldest ``run_at`` of a pending job before ``since`` (None:
    there is none)."""
    sql = FRONT_PROBE_ALL if queues is None else FRONT_PROBE_QUEUES
    params = {
        "since": since,
        "queues": None if queues is None else list(queues),
        "tasks": None if tasks is None else list(tasks),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]
