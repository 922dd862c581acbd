"""The pg_cron engine: install schedules as ``cron.job`` entries named ``pgjobs:<name>``.

pg_cron only inserts rows (``SELECT pgjobs_enqueue(...)``); workers do the work.
Each entry builds the same idempotency key as the built-in ticker,
``cron:<name>:<fire time UTC>``, from the minute it runs in, so running both
engines at once still makes one job per fire time.

pg_cron lives in one database per server (``cron.database_name``). When that is
not the application's database, entries are made with
``cron.schedule_in_database`` from a connection to the pg_cron database.
Optionally the reaper and the pruner are installed too (``pgjobs:_reap``,
``pgjobs:_prune``), as plain SQL, so maintenance runs with no worker up.

A sync is idempotent: entries whose schedule, command, database and user already
match are left alone; changed ones are updated in place; ``pgjobs:*`` entries
that no longer match a schedule are removed. All in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db import pg_cron
from django_pgjobs.db.store import EVENT_PRUNE_BATCH, JOB_PRUNE_BATCH, JOB_REAP_STALE, reap_params
from django_pgjobs.maintenance.cron import Schedule
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.support.pgconn import psycopg_params, set_up_session

PREFIX = "pgjobs:"
REAP_ENTRY = PREFIX + "_reap"
PRUNE_ENTRY = PREFIX + "_prune"
#: Rows per maintenance statement run by pg_cron (once a minute).
MAINTENANCE_BATCH = 5000


class PgCronError(RuntimeError):
    """pg_cron cannot be used as things are; the message says what to do."""


@dataclass(frozen=True)
class Entry:
    jobname: str
    schedule: str
    command: str


@dataclass(frozen=True)
class Location:
    """Where pg_cron lives relative to the application database."""

    app_database: str
    cron_database: str
    username: str
    version: str

    @property
    def same_database(self) -> bool:
        return self.app_database == self.cron_database


def _enable_instructions(database: str, server_major: str, available: bool) -> str:
    install = (
        "the pg_cron package is installed on the server"
        if available
        else f"install it first (Debian/Ubuntu: apt-get install postgresql-{server_major}-cron; "
        "managed services: enable the pg_cron extension in the parameter group/flags)"
    )
    return (
        f"pg_cron is not loaded on this PostgreSQL server ({install}). To enable it:\n"
        "  1. in postgresql.conf set\n"
        "       shared_preload_libraries = 'pg_cron'\n"
        f"       cron.database_name = '{database}'\n"
        "  2. restart PostgreSQL\n"
        f"  3. in database {database!r}, as a superuser: CREATE EXTENSION pg_cron;\n"
        "then run manage.py sync_cron --pg-cron again. Or keep the built-in engine: "
        "every runjobs process enqueues due schedules, no extension needed."
    )


def locate(alias: str | None = None) -> Location:
    """Find pg_cron, or raise ``PgCronError`` saying exactly how to enable it."""
    connection = connections[alias or get_settings().DATABASE]
    with connection.cursor() as cursor:
        cursor.execute(pg_cron.CRON_LOCATE)
        app_db, user, version_num, cron_db, here_version, available = cursor.fetchone()
    major = str(int(version_num) // 10000)
    if here_version is not None:
        return Location(app_db, app_db, user, here_version)
    if not cron_db:
        raise PgCronError(_enable_instructions(app_db, major, available))
    with _cron_connection(alias, cron_db) as conn:
        row = conn.execute(pg_cron.CRON_VERSION).fetchone()
    if row is None:
        raise PgCronError(
            f"pg_cron is loaded (cron.database_name = {cron_db!r}) but the extension is not "
            f"created. In database {cron_db!r}, as a superuser, run: CREATE EXTENSION pg_cron;"
        )
    return Location(app_db, cron_db, user, row[0])


@contextmanager
def _cron_connection(alias: str | None, dbname: str) -> Iterator[psycopg.Connection[Any]]:
    """A psycopg connection to ``dbname`` with the application's credentials."""
    alias = alias or get_settings().DATABASE
    with psycopg.connect(**psycopg_params(alias, dbname=dbname)) as conn:
        set_up_session(conn, alias)  # as Django's: the same current_user
        yield conn


def pg_schedule(schedule: Schedule) -> str:
    """The schedule in pg_cron's syntax, or ``PgCronError`` when pg_cron cannot express it."""
    if schedule.has_seconds:
        raise PgCronError(
            f"schedule {schedule.name!r} ({schedule.expression!r}) has a seconds field; pg_cron "
            "runs at most once a minute. Use the built-in engine for it, or a 5-field expression."
        )
    if schedule.timezone not in ("UTC", "utc"):
        raise PgCronError(
            f"schedule {schedule.name!r} uses timezone {schedule.timezone!r}, but pg_cron runs "
            "schedules in UTC (GMT). Rewrite the expression in UTC or use the built-in engine."
        )
    return schedule.expression


def _literal(conn: psycopg.Connection[Any], query: str, params: Any) -> str:
    return psycopg.ClientCursor(conn).mogrify(query, params)


def enqueue_command(conn: psycopg.Connection[Any], schedule: Schedule, max_attempts: int) -> str:
    """``SELECT pgjobs_enqueue(...)`` with the key ``cron:<name>:<minute it runs in, UTC>``."""
    import json

    # The same text as cron.KEY_TIME_FORMAT ('%Y-%m-%dT%H:%M:%SZ'), in to_char's syntax.
    fmt = 'YYYY-MM-DD"T"HH24:MI:SS"Z"'
    return _literal(
        conn,
        pg_cron.CRON_ENQUEUE,
        [
            schedule.task,
            json.dumps(schedule.args),
            json.dumps(schedule.kwargs),
            schedule.queue,
            schedule.priority,
            f"cron:{schedule.name}:",
            fmt,
            max_attempts,
        ],
    )


def maintenance_entries(conn: psycopg.Connection[Any]) -> list[Entry]:
    """The reaper and the pruner as SQL run once a minute by pg_cron."""
    params = reap_params(
        stale_after=get_settings().STALE_AFTER, batch=MAINTENANCE_BATCH, by=" by pg_cron"
    )
    reap = _literal(conn, JOB_REAP_STALE, params)
    prunes = [
        _literal(
            conn,
            JOB_PRUNE_BATCH,
            {"status": status, "older_than": older_than, "batch": MAINTENANCE_BATCH},
        )
        for status, older_than in Pruner().plan()
    ]
    event_retention = get_settings().EVENT_RETENTION
    prunes.append(
        _literal(
            conn,
            EVENT_PRUNE_BATCH,
            {"older_than": event_retention, "batch": MAINTENANCE_BATCH},
        )
    )
    entries = [Entry(REAP_ENTRY, "* * * * *", " ".join(reap.split()))]
    if prunes:
        entries.append(
            Entry(PRUNE_ENTRY, "* * * * *", "; ".join(" ".join(p.split()) for p in prunes))
        )
    return entries


def desired_entries(
    conn: psycopg.Connection[Any], schedules: list[Schedule], *, maintenance: bool
) -> list[Entry]:
    default_attempts = get_settings().MAX_ATTEMPTS
    entries = [
        Entry(
            PREFIX + s.name,
            pg_schedule(s),
            enqueue_command(conn, s, s.max_attempts or default_attempts),
        )
        for s in schedules
    ]
    if maintenance:
        entries.extend(maintenance_entries(conn))
    return entries


@dataclass(frozen=True)
class Change:
    jobname: str
    action: str  # "created", "updated", "unchanged", "removed"
    schedule: str


def sync(
    schedules: list[Schedule],
    *,
    maintenance: bool = False,
    uninstall: bool = False,
    dry_run: bool = False,
    alias: str | None = None,
) -> tuple[Location, list[Change]]:
    """Make the ``pgjobs:*`` entries of ``cron.job`` match ``schedules``; one transaction."""
    location = locate(alias)
    with _cron_connection(alias, location.cron_database) as conn, conn.transaction():
        conn.execute(pg_cron.CRON_SYNC_LOCK)
        desired = [] if uninstall else desired_entries(conn, schedules, maintenance=maintenance)
        existing = {
            row[1]: row
            for row in conn.execute(
                pg_cron.CRON_ENTRIES, [PREFIX + "%", location.app_database]
            ).fetchall()
        }
        changes: list[Change] = []
        for entry in desired:
            row = existing.pop(entry.jobname, None)
            if row is not None and (row[2], row[3], row[5], row[6]) == (
                entry.schedule,
                entry.command,
                location.username,
                True,
            ):
                changes.append(Change(entry.jobname, "unchanged", entry.schedule))
                continue
            changes.append(
                Change(entry.jobname, "created" if row is None else "updated", entry.schedule)
            )
            if dry_run:
                continue
            if location.same_database:
                conn.execute(pg_cron.CRON_SCHEDULE, [entry.jobname, entry.schedule, entry.command])
            else:
                conn.execute(
                    pg_cron.CRON_SCHEDULE_IN_DATABASE,
                    [entry.jobname, entry.schedule, entry.command, location.app_database],
                )
        for jobname, row in sorted(existing.items()):
            changes.append(Change(jobname, "removed", row[2]))
            if not dry_run:
                conn.execute(pg_cron.CRON_UNSCHEDULE, [row[0]])
    return location, changes
