"""System checks. IDs are documented in the reference (docs/reference/checks.md).

E001 database is not PostgreSQL
E002 unknown PGJOBS key / bad PGJOBS value / bad environment variable (conf/ declares each)
E003 STALE_AFTER < 3 x HEARTBEAT_INTERVAL
E004 invalid recurring schedule (expression, timezone, entry)   E005 unknown task in CRON
E010 bad PGJOBS["QUEUES"] entry (unknown key, max_running < 1, rate not "N/s"|"N/m"|"N/h")
E011 the database has part of the migrations the squashed migration replaces (database check)
E012 EVENT_RETENTION shorter than EVENT_LOOKBACK (an event would be pruned while it still counts)
W004 CRON_CATCHUP_WINDOW not shorter than a RETENTION (a pruned fire time could run again)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.db import DatabaseError
from django.db.migrations.exceptions import NodeNotFoundError

from django_pgjobs.conf import (
    PgJobsSettings,
    SettingsError,
    build_settings,
    environment_errors,
    raw_settings,
    settings_errors,
)
from django_pgjobs.db.readiness import replaced_in_part, replaced_in_part_message

#: Where a pip user finds the keys: the documentation's page, by title (not a repository path).
SETTINGS_HINT = (
    "Every PGJOBS key, its type and default: the 'Settings' page of the "
    "django-pgjobs reference documentation."
)
CRON_HINT = "See the 'Recurring jobs' how-to in the django-pgjobs documentation."


def _valid_settings() -> PgJobsSettings | None:
    """The settings, for the checks that need them valid (``check_settings`` says why not)."""
    try:
        return build_settings(raw_settings())
    except SettingsError:
        return None


# Not tagged "database": it reads settings only, and Django 6.1's `check` skips
# database-tagged checks unless --database is given (so bad keys went unreported).
@checks.register(checks.Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E002 for every bad key, value and environment variable at once; then E001, E003."""
    try:
        problems = settings_errors(raw_settings())
    except SettingsError as exc:  # PGJOBS is not a dict
        problems = [exc]
    problems += environment_errors()
    conf = _valid_settings()
    if problems or conf is None:
        return [checks.Error(str(p), hint=SETTINGS_HINT, id="django_pgjobs.E002") for p in problems]
    errors: list[checks.CheckMessage] = []
    alias = conf.DATABASE
    databases = getattr(django_settings, "DATABASES", {})
    if alias not in databases:
        errors.append(
            checks.Error(
                f"PGJOBS['DATABASE'] is {alias!r}, which is not in DATABASES",
                id="django_pgjobs.E001",
            )
        )
    else:
        engine = databases[alias].get("ENGINE", "")
        if "postgresql" not in engine:
            errors.append(
                checks.Error(
                    f"django-pgjobs needs PostgreSQL; database {alias!r} uses {engine!r}",
                    hint="Set ENGINE to 'django.db.backends.postgresql' (psycopg 3).",
                    id="django_pgjobs.E001",
                )
            )
    if conf.STALE_AFTER < 3 * conf.HEARTBEAT_INTERVAL:
        errors.append(
            checks.Error(
                f"PGJOBS['STALE_AFTER'] ({conf.STALE_AFTER:g}s) must be at least 3 x "
                f"HEARTBEAT_INTERVAL ({conf.HEARTBEAT_INTERVAL:g}s), or healthy jobs get reclaimed",
                id="django_pgjobs.E003",
            )
        )
    if conf.EVENT_RETENTION < conf.EVENT_LOOKBACK:
        errors.append(
            checks.Error(
                f"PGJOBS['EVENT_RETENTION'] ({conf.EVENT_RETENTION:g}s) is shorter than "
                f"EVENT_LOOKBACK ({conf.EVENT_LOOKBACK:g}s): an event would be pruned while a "
                "wait could still count it",
                id="django_pgjobs.E012",
            )
        )
    return errors


def _with_valid_settings(
    check: Callable[[PgJobsSettings], list[checks.CheckMessage]],
) -> Callable[..., list[checks.CheckMessage]]:
    """Register ``check(conf)`` as a system check that is skipped while the settings are
    bad (``check_settings`` reports why)."""

    def run(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
        conf = _valid_settings()
        return [] if conf is None else check(conf)

    # Not functools.wraps: Django inspects the signature (it must take **kwargs).
    run.__name__, run.__qualname__, run.__doc__ = check.__name__, check.__qualname__, check.__doc__
    return checks.register(checks.Tags.compatibility)(run)


@_with_valid_settings
def check_cron(conf: PgJobsSettings) -> list[checks.CheckMessage]:
    """Recurring schedules parse, name registered tasks, and fit the retention."""
    from django_pgjobs.maintenance.cron import collect_schedules

    schedules, problems = collect_schedules(conf.CRON)
    messages: list[checks.CheckMessage] = [
        checks.Error(str(p), hint=CRON_HINT, id=p.check_id) for p in problems
    ]
    shortest = min((r for r in conf.RETENTION.values() if r is not None), default=None)
    if schedules and shortest is not None and shortest <= conf.CRON_CATCHUP_WINDOW:
        messages.append(
            checks.Warning(
                f"PGJOBS['CRON_CATCHUP_WINDOW'] ({conf.CRON_CATCHUP_WINDOW:g}s) is not shorter than "
                f"the shortest RETENTION ({shortest:g}s): a fire time whose job was already pruned "
                "could be enqueued again after an outage",
                id="django_pgjobs.W004",
            )
        )
    return messages


@_with_valid_settings
def check_queues(conf: PgJobsSettings) -> list[checks.CheckMessage]:
    """``PGJOBS["QUEUES"]`` entries: known keys, max_running >= 1, a valid rate."""
    from django_pgjobs.queues import queue_problems

    return [
        checks.Error(p, hint="See docs/howto/control-throughput.md", id="django_pgjobs.E010")
        for p in queue_problems(conf.QUEUES)
    ]


@checks.register(checks.Tags.database)
def check_migration_series(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A database part-way through the migrations the squash replaced: ``migrate`` (which
    runs the database checks) stops here instead of silently migrating nothing."""
    errors: list[checks.CheckMessage] = []
    for alias in databases or ():
        try:
            part = replaced_in_part(alias)
        except (DatabaseError, NodeNotFoundError):
            continue  # no server, or a broken migration graph: migrate says so itself
        if part:
            errors.append(
                checks.Error(replaced_in_part_message(alias, part), id="django_pgjobs.E011")
            )
    return errors
