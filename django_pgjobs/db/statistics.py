"""The statistics pass's statements: has the jobs table outgrown the size its plans were
made at, and ANALYZE it when it has (``maintenance/statistics.py`` says why)."""

from __future__ import annotations

from django_pgjobs.db.cursor import Connection
from django_pgjobs.db.tables import JOB

# The jobs table's pages now and at its last VACUUM or ANALYZE (pg_class.relpages, which
# either sets, invalidating every session's cached plans that read the table), whether it
# was ever analysed since it was created or truncated (reltuples is -1 until then), and
# whether this role may ANALYZE it (its owner, a member of the owner's role, or a
# superuser; anyone else would get a WARNING every pass). Reads the catalog; no lock
# beyond the relation's AccessShareLock for pg_relation_size.
JOB_STATISTICS_AGE = f"""
SELECT pg_relation_size(c.oid) / current_setting('block_size')::int,
       c.relpages, c.reltuples < 0, pg_has_role(c.relowner, 'USAGE')
  FROM pg_class c
 WHERE c.oid = '{JOB}'::regclass
"""

# New statistics for the jobs table, which invalidates the plans every session cached
# for its statements (a prepared statement's generic plan included). SKIP_LOCKED: when
# a VACUUM or another ANALYZE holds the table's SHARE UPDATE EXCLUSIVE lock (autovacuum,
# another worker's pass), skip with a notice instead of waiting; that one refreshes the
# statistics too. Takes that lock only, which conflicts with no read or write of rows.
JOB_ANALYZE = f"ANALYZE (SKIP_LOCKED) {JOB}"


def job_statistics_age(connection: Connection) -> tuple[int, int, bool, bool]:
    """JOB_STATISTICS_AGE: ``(pages, pages at the last VACUUM or ANALYZE, never
    analysed, may analyse)``."""
    with connection.cursor() as cursor:
        cursor.execute(JOB_STATISTICS_AGE)
        row = cursor.fetchone()
    if row is None:  # the regclass cast raises first; for the type checker
        raise LookupError("pg_class has no row for the jobs table")
    pages, planned, never, may = row
    return int(pages), int(planned), bool(never), bool(may)


def job_analyze(connection: Connection) -> None:
    """JOB_ANALYZE (autocommit: ANALYZE in the caller's transaction would hold its lock
    until that ends)."""
    with connection.cursor() as cursor:
        cursor.execute(JOB_ANALYZE)
