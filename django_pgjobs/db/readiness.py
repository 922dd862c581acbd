"""Is the database ready for django-pgjobs? Turn the raw errors of a missing database, a
missing table or an unapplied migration into one sentence that names the fix.

Used where a user first meets them: ``runjobs`` (which must not loop for ever on a
missing table), ``jobs_status``, ``retry_jobs``/``cancel_jobs`` and ``enqueue``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from django.db import DatabaseError, OperationalError, ProgrammingError, connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db.tables import JOB

MIGRATE = "run `python manage.py migrate`"

# Does the jobs table exist (in the connection's search_path)? Catalog only.
TABLE_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"


@dataclass(frozen=True)
class Problem:
    """Why the database is not ready. ``fatal``: retrying without a fix cannot help."""

    message: str
    fatal: bool


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of ``exc`` or of the psycopg error Django wrapped in it."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return None


def is_missing_table(exc: BaseException) -> bool:
    """A ``relation "django_pgjobs_…" does not exist`` error (SQLSTATE 42P01)."""
    return (
        isinstance(exc, ProgrammingError)
        and sqlstate(exc) == "42P01"
        and "django_pgjobs" in str(exc)
    )


def missing_table_message(alias: str) -> str:
    name = connections[alias].settings_dict.get("NAME") or "?"
    return (
        f"the django-pgjobs tables do not exist in database {name!r} (alias {alias!r}): {MIGRATE}"
    )


def explain(exc: BaseException, alias: str) -> str | None:
    """A sentence naming the fix for a missing database or table, else None."""
    if is_missing_table(exc):
        return missing_table_message(alias)
    text = str(exc)
    if isinstance(exc, OperationalError) and "does not exist" in text and "database" in text:
        name = connections[alias].settings_dict.get("NAME") or "?"
        return (
            f"database {name!r} (alias {alias!r}) does not exist: create it "
            f"(`createdb {name}`, or point DATABASES/DATABASE_URL at one that exists), "
            f"then {MIGRATE}"
        )
    return None


def unapplied_migrations(alias: str) -> list[str]:
    """django_pgjobs migrations in the code that the database has not applied."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "django_pgjobs"]
    plan = executor.migration_plan(targets)
    return [f"{m.app_label}.{m.name}" for m, backwards in plan if not backwards]


def replaced_in_part(alias: str) -> list[str]:
    """django_pgjobs migrations a squashed migration replaces that the database has
    applied, when it has not applied all of them (an empty list otherwise). Django then
    drops the squash from its plan and, the replaced files being gone, migrates nothing
    and says nothing: such a database must first reach the squash's end with code that
    still has the replaced migrations (docs/howto/upgrade.md)."""
    from django.db.migrations.loader import MigrationLoader

    # With the replacements made, as migrate makes them: a later migration that depends
    # on a replaced one is then read as depending on the squash.
    loader = MigrationLoader(connections[alias])
    applied = loader.applied_migrations or {}
    part: list[str] = []
    for key, migration in loader.replacements.items():
        done = [name for app, name in migration.replaces if (app, name) in applied]
        if key[0] == "django_pgjobs" and 0 < len(done) < len(migration.replaces):
            part.extend(done)
    return part


def replaced_in_part_message(alias: str, part: list[str]) -> str:
    name = connections[alias].settings_dict.get("NAME") or "?"
    return (
        f"database {name!r} (alias {alias!r}) has django-pgjobs migrations up to "
        f"{part[-1]} applied but not the rest of the series 0001-0015 that this version "
        "replaces with one squashed migration, so `migrate` would change nothing: migrate "
        "it to 0015_job_timeout_no_limit with a django-pgjobs version that still has those "
        "migrations first (see 'Upgrading' in the django-pgjobs documentation)"
    )


def autocommit_problem(
    alias: str,
    who: str = "a worker",
    why: str = "it commits each claim, completion and heartbeat as it goes",
) -> Problem | None:
    """With Django's autocommit off, what is written outside ``atomic()`` waits in a
    transaction nothing commits, and ``atomic()`` itself does not commit: a worker's
    claims never committed (their completions, on another connection, found the lease
    lost and nothing ran), and ``cancel_jobs`` said "Cancelled 1 job." and changed
    nothing."""
    if connections[alias].settings_dict.get("AUTOCOMMIT", True):
        return None
    return Problem(
        f"DATABASES[{alias!r}]['AUTOCOMMIT'] is False, and {who} needs Django's "
        f"autocommit: {why}. Run it with settings that leave AUTOCOMMIT at its default "
        "(True); enqueueing works either way (it writes in your transaction)",
        fatal=True,
    )


def check(alias: str) -> Problem | None:
    """Autocommit on; connect, look for the tables and for unapplied django_pgjobs
    migrations."""
    connection = connections[alias]
    autocommit = autocommit_problem(alias)
    if autocommit is not None:
        return autocommit
    try:
        with connection.cursor() as cursor:
            cursor.execute(TABLE_EXISTS, [JOB])
            (exists,) = cursor.fetchone()
        if not exists:
            return Problem(missing_table_message(alias), fatal=True)
        part = replaced_in_part(alias)
        if part:
            return Problem(replaced_in_part_message(alias, part), fatal=True)
        pending = unapplied_migrations(alias)
    except DatabaseError as exc:
        explained = explain(exc, alias)
        connection.close()
        if explained:
            return Problem(explained, fatal=True)
        return Problem(f"cannot reach database {alias!r}: {exc}".strip(), fatal=False)
    if pending:
        return Problem(
            f"database {connection.settings_dict.get('NAME')!r} lacks django-pgjobs "
            f"migration(s) {', '.join(pending)} that this code needs: {MIGRATE}",
            fatal=True,
        )
    return None


F = TypeVar("F", bound=Callable[..., Any])


def names_the_fix(what: str) -> Callable[[F], F]:
    """Decorate a function taking ``using=``: a missing-table error becomes a
    ``ProgrammingError`` whose message says to run migrate (the original is chained)."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except ProgrammingError as exc:
                if not is_missing_table(exc):
                    raise
                alias = kwargs.get("using") or get_settings().DATABASE
                name = getattr(args[0], "name", "") if args else ""
                raise ProgrammingError(
                    f"cannot {what} {name}".rstrip() + ": " + missing_table_message(alias)
                ) from exc

        return cast(F, wrapper)

    return decorate
