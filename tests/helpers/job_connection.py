"""What a job's raw transaction left behind: the rows it wrote, the sessions idle in
a transaction."""

from __future__ import annotations

from django.db import connection


def numbers_in(table: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT n FROM {table} ORDER BY n")
        return [n for (n,) in cursor.fetchall()]


def idle_in_transaction() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()"
        )
        (count,) = cursor.fetchone()
        return int(count)
