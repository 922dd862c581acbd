"""The minute rollup: finished jobs counted per minute, queue and status, so
the pages that show the last hour read minutes, not jobs.

``django_pgjobs_minute`` holds exactly the jobs that finished in ``[rolled_from,
rolled_to)`` of ``django_pgjobs_rollupmark``'s one row. A pass (``maintenance/rollup.py``)
moves ``rolled_to`` forward inside one transaction: it locks the mark row
(``ROLLUP_LOCK``, ``FOR UPDATE SKIP LOCKED``: one pass at a time across all workers,
the others skip), then counts the jobs finished between the old and the new mark
through the partial ``finished_at`` index (``ROLLUP_MINUTES``), adds them to their
minutes and moves the mark, in one statement. Its cost follows the new finishes, never
the history.

Why no job is missed or counted twice: intervals are half-open and each pass starts
where the last one ended, under the lock. A job can only appear in an interval already
passed if its finishing transaction commits later: every statement stamps
``finished_at = now()``, the start of its transaction. So the new mark never goes past
the start of any transaction still open in this database (``pg_stat_activity``), read
*before* the counting statement takes its snapshot: whatever finishes before the mark
has committed by then and is seen. Sessions of other roles whose activity the worker's
role may not see hold the mark back by ``HIDDEN_SETTLE`` instead.

Readers (``finished_since`` and ``claimed_since``) add the live tail: jobs finished since
``rolled_to`` (and before ``rolled_from``, should a window reach back that far), read
from the jobs table through the same index, in the same snapshot as the minutes. With
no mark yet (no worker has run a pass) they read the jobs table alone, as before.
"""

from __future__ import annotations

from datetime import datetime

from django_pgjobs.db.cursor import Connection
from django_pgjobs.db.tables import JOB, MINUTE, ROLLUP_MARK, by_id_is
from django_pgjobs.states import JobStatus

#: With a session the worker's role cannot see, the mark stays this far behind now().
HIDDEN_SETTLE = 60

# One pass at a time: the mark row, locked FOR UPDATE SKIP LOCKED until the pass's
# transaction ends (a pass finding it locked skips: another worker is counting). The same
# statement reads the database's clock and the start of the oldest transaction still open
# in this database (autovacuum aside: it finishes no job): the new mark may not pass it.
# pg_stat_activity is read after this transaction's snapshot; ROLLUP_MINUTES, the next
# statement, takes a newer one. No other lock.
ROLLUP_LOCK = f"""
SELECT m.rolled_from, m.rolled_to, now(),
       LEAST(now() - interval '1 second',
             (SELECT min(a.xact_start) FROM pg_stat_activity a
               WHERE a.datname = current_database()
                 AND a.backend_type IS DISTINCT FROM 'autovacuum worker'),
             (SELECT now() - make_interval(secs => {HIDDEN_SETTLE}) FROM pg_stat_activity a
               WHERE a.datname = current_database() AND a.query = '<insufficient privilege>'
               LIMIT 1))
  FROM {ROLLUP_MARK} AS m
 WHERE m.id = 1
   FOR UPDATE OF m SKIP LOCKED
"""

# The mark row, written once (by the first pass, or again after a flush of the tables):
# ON CONFLICT DO NOTHING, so passes that race here write one row. Locks only that row.
# Run when ROLLUP_LOCK found no row to lock (missing, or locked by another pass), as a
# transaction of its own, outside the pass's (maintenance/rollup.py): committed with the
# statement, the new row's key is never held by a worker that froze (SIGSTOP, a paused
# VM) mid-pass. NOT EXISTS first: with the row there, nothing is inserted and nothing
# waits; a bare ON CONFLICT waits for the transaction that updated the conflicting row.
# Either wait held every other worker's maintenance thread, and their reaper with it,
# so the frozen worker's jobs were never reclaimed (both seen in CI behind pgbouncer;
# tests/db/test_rollup.py).
ROLLUP_MARK_INSERT = f"""
INSERT INTO {ROLLUP_MARK} (id)
SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM {ROLLUP_MARK} WHERE id = 1)
ON CONFLICT DO NOTHING
"""

# Count the jobs finished in [since, until) into their minutes (and the earliest run_at
# of those that waited into their minute of claim), forget minutes before keep_from, and
# move the mark: one statement, inside the transaction that holds ROLLUP_LOCK's row lock
# (so no other pass writes these minutes). Reads the jobs through the partial
# finished_at index (a range of new finishes); locks no job row. Upserted minute rows are
# locked by the insert until commit; the DELETE only touches minutes before keep_from,
# which no row written here has.
ROLLUP_MINUTES = f"""
WITH finished AS (
    SELECT queue, status, finished_at, started_at, run_at FROM {JOB}
     WHERE finished_at IS NOT NULL
       AND finished_at >= %(since)s AND finished_at < %(until)s
), counted AS (
    SELECT date_trunc('minute', finished_at) AS minute, queue, status,
           count(*) AS finished, NULL::timestamptz AS waited_since
      FROM finished GROUP BY 1, 2, 3
    UNION ALL
    SELECT date_trunc('minute', started_at), queue, status, 0, min(run_at)
      FROM finished
     WHERE started_at > run_at AND started_at >= %(keep_from)s
     GROUP BY 1, 2, 3
), added AS (
    INSERT INTO {MINUTE} AS m (minute, queue, status, finished, waited_since)
    SELECT minute, queue, status, sum(finished), min(waited_since)
      FROM counted GROUP BY 1, 2, 3
    ON CONFLICT (minute, queue, status) DO UPDATE
       SET finished = m.finished + EXCLUDED.finished,
           waited_since = LEAST(m.waited_since, EXCLUDED.waited_since)
), forgotten AS (
    DELETE FROM {MINUTE} WHERE minute < %(keep_from)s
), moved AS (
    UPDATE {ROLLUP_MARK} SET rolled_from = %(keep_from)s, rolled_to = %(until)s WHERE id = 1
)
SELECT count(*) FROM finished
"""


def rollup_lock(
    connection: Connection,
) -> tuple[datetime | None, datetime | None, datetime, datetime] | None:
    """ROLLUP_LOCK (inside a transaction): lock the mark row ``FOR UPDATE SKIP LOCKED``,
    one pass at a time; ``(rolled_from, rolled_to, now, settled)``, or ``None`` when
    another pass holds the mark (or there is no mark row yet)."""
    with connection.cursor() as cursor:
        cursor.execute(ROLLUP_LOCK)
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3])


def rollup_mark_insert(connection: Connection) -> None:
    """ROLLUP_MARK_INSERT: INSERT the minute counts' mark row if it is missing."""
    with connection.cursor() as cursor:
        cursor.execute(ROLLUP_MARK_INSERT)


def rollup_minutes(
    connection: Connection, *, since: datetime, until: datetime, keep_from: datetime
) -> int:
    """ROLLUP_MINUTES: UPSERT the finished jobs of ``[since, until)`` into the minutes,
    keep minutes from ``keep_from``, move the mark, under ``rollup_lock``; locks no job
    row. How many jobs were counted."""
    with connection.cursor() as cursor:
        cursor.execute(ROLLUP_MINUTES, {"since": since, "until": until, "keep_from": keep_from})
        row = cursor.fetchone()
    return int(row[0]) if row else 0


_ROLLED_TO = f"(SELECT rolled_to FROM {ROLLUP_MARK} WHERE id = 1)"
_ROLLED_FROM = f"(SELECT rolled_from FROM {ROLLUP_MARK} WHERE id = 1)"


def _live(low: str, columns: str, where: str = "") -> str:
    """Jobs finished since ``low`` that the minutes do not hold: since ``rolled_to``
    (GREATEST skips a NULL mark: then all of them) and before ``rolled_from``. Two range
    scans of the partial finished_at index, bounds known at run time.

    ``< 'infinity'`` is always true: with a bound on each side the planner estimates a
    narrow range (0.5 % of the rows) instead of a third of the table for a bound it
    cannot see, and stays off parallel plans, which cost far more than the scan under load."""
    return f"""SELECT {columns} FROM {JOB}
     WHERE finished_at IS NOT NULL AND finished_at >= GREATEST({low}, {_ROLLED_TO})
       AND finished_at < 'infinity'{where}
    UNION ALL
    SELECT {columns} FROM {JOB}
     WHERE finished_at IS NOT NULL AND finished_at >= {low}
       AND finished_at < {_ROLLED_FROM}{where}"""


def finished_since(low: str, *, status: str | None = None) -> str:
    """A relation ``(minute, queue, status, n)``: jobs finished since ``low`` (a SQL
    expression of a minute's start), per minute, queue and status (several rows may
    share a key: sum them). ``status``: only that one."""
    where = f" AND status = '{JobStatus(status)}'" if status else ""
    # by_id_is: the live tail's status test must not match the status index, or the
    # planner reads every dead job of the retention and filters them
    # by finished_at; the finished_at index reads only the tail.
    live_where = f" AND {by_id_is(JobStatus(status))}" if status else ""
    return f"""
    SELECT minute, queue, status, finished AS n FROM {MINUTE}
     WHERE minute >= {low} AND finished > 0{where}
    UNION ALL
    SELECT date_trunc('minute', finished_at), queue, status, count(*) FROM (
        {_live(low, "finished_at, queue, status", live_where)}
    ) AS live GROUP BY 1, 2, 3"""


def claimed_since(low: str) -> str:
    """A relation ``(queue, minute, earliest)``: per queue and minute of claim since
    ``low``, the earliest ``run_at`` of jobs claimed then that had waited: from the minutes,
    the live tail of finished jobs, and the running jobs (the running index)."""
    columns = "queue, started_at, run_at"
    return f"""
    SELECT queue, minute, waited_since FROM {MINUTE}
     WHERE minute >= {low} AND waited_since IS NOT NULL
    UNION ALL
    SELECT queue, date_trunc('minute', started_at), min(run_at) FROM (
        {_live(low, columns)}
        UNION ALL
        SELECT {columns} FROM {JOB} WHERE status = '{JobStatus.RUNNING}'
    ) AS live
     WHERE started_at >= {low} AND started_at > run_at
     GROUP BY 1, 2"""
