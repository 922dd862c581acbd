"""The ``PGJOBS`` settings and the environment variables: each declared once, here.

A key is one line of ``PgJobsSettings``: its default, its parser (``parsers.py``)
and the sentence the reference shows. From those declarations come the settings
object, ``build_settings`` and ``settings_errors`` (check ``django_pgjobs.E002``)
and the tables of ``docs/reference/settings.md`` (``reference_tables``; a test keeps
the page equal to them). Durations accept seconds (int or float) or a ``timedelta``
and are normalised to float seconds, so the rest of the package never sees a
``timedelta``. Rules between keys (E001, E003, W004) live in ``checks.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar, overload

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_pgjobs.conf import parsers
from django_pgjobs.conf.parsers import Parser
from django_pgjobs.conf.parsers import (
    SettingsError as SettingsError,
)  # re-exported: callers know conf
from django_pgjobs.conf.parsers import suggest as suggest

T = TypeVar("T")

E002 = "django_pgjobs.E002"


class Setting(Generic[T]):
    """One ``PGJOBS`` key, declared as an attribute of ``PgJobsSettings``; reading it
    from the settings object gives the parsed value (typed ``T``)."""

    def __init__(self, default: Any, parser: Parser[T], doc: str, *, checks: str = "") -> None:
        self.name = ""  # set by __set_name__
        self.default = default
        self.parser = parser
        self.doc = doc
        #: The check IDs that report this key (every key: E002, a bad value).
        self.checks = tuple(sorted({E002, *checks.split()}))

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...
    @overload
    def __get__(self, obj: PgJobsSettings, owner: type | None = None) -> T: ...
    def __get__(self, obj: PgJobsSettings | None, owner: type | None = None) -> T | Setting[T]:
        # Only the class's attribute is read here: an instance keeps its parsed values
        # in its __dict__, which Python reads first (a plain attribute read, no call).
        if obj is None:
            return self
        value: T = vars(obj)[self.name]
        return value

    def parse(self, value: Any) -> T:
        return self.parser.parse(value, f"PGJOBS[{self.name!r}]")


_RETENTION = {"completed": 7 * 86400.0, "dead": 30 * 86400.0, "cancelled": 7 * 86400.0}


class PgJobsSettings:
    """The effective settings: each key parsed from ``PGJOBS`` or its default (read-only)."""

    DATABASE = Setting(
        "default",
        parsers.alias,
        "Database alias holding the job tables. Must be in `DATABASES` and be PostgreSQL.",
        checks="django_pgjobs.E001",
    )
    MAX_ATTEMPTS = Setting(
        5, parsers.whole, "Attempts of a job whose `@job` does not set `max_attempts`."
    )
    BACKOFF_BASE = Setting(
        1.0,
        parsers.duration,
        "Base of the retry delay: `uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**(attempt-1)))`.",
    )
    BACKOFF_CAP = Setting(3600.0, parsers.duration, "Longest retry delay.")
    HEARTBEAT_INTERVAL = Setting(
        5.0,
        parsers.duration,
        "How often a worker refreshes `heartbeat_at` of its running jobs (one statement "
        "for all of them) and its row in the workers table.",
        checks="django_pgjobs.E003",
    )
    STALE_AFTER = Setting(
        30.0,
        parsers.duration,
        "A running job whose heartbeat is older than this is reclaimed by the reaper. "
        "Must be at least 3 × `HEARTBEAT_INTERVAL`.",  # noqa: RUF001 (the page's sign)
        checks="django_pgjobs.E003",
    )
    HEARTBEAT_PROCESS = Setting(
        True,
        parsers.flag,
        "Each worker starts a small heartbeat process (Linux) that refreshes its jobs "
        "while the worker cannot, e.g. while a job holds the GIL, so a live worker is "
        "not taken for dead. `False`: the worker's heartbeat thread alone (see "
        "{doc}`../explanation/heartbeats-and-fencing`).",
    )
    POLL_INTERVAL = Setting(
        1.0,
        parsers.duration,
        "An idle worker's safety-net poll (jittered ±20 %); also how soon a job with a "
        "future `run_at` is noticed.",
    )
    BATCH_SIZE = Setting(
        1000,
        parsers.whole,
        "Most jobs claimed in one round trip (`runjobs --batch` overrides it); claims "
        "reach it only for jobs of about a millisecond or less (the prefetch covers 20 ms "
        "of work at the observed job time).",
    )
    SHUTDOWN_TIMEOUT = Setting(
        30.0,
        parsers.duration,
        "After SIGTERM, how long in-flight jobs may finish before they are released back "
        "to `pending`.",
    )
    REAPER_INTERVAL = Setting(10.0, parsers.duration, "How often each worker runs the reaper.")
    PRUNER_INTERVAL = Setting(
        300.0,
        parsers.duration,
        "How often each worker runs the pruner; a pass that stopped at its 2 s budget with "
        "rows still due runs again within 10 s instead.",
    )
    CRON_INTERVAL = Setting(
        1.0, parsers.duration, "How often each worker's cron ticker looks for due fire times."
    )
    CRON_CATCHUP_WINDOW = Setting(
        3600.0,
        parsers.duration,
        "After a gap (no worker was running), the most recent missed fire time is still "
        "enqueued if it is no older than this; older ones are skipped.",
    )
    RETENTION = Setting(
        _RETENTION,
        parsers.retention(_RETENTION),
        "How long finished jobs are kept before the pruner deletes them; `None` keeps "
        "them for ever. Keys you leave out keep their default.",
    )
    EVENT_LOOKBACK = Setting(
        3600.0,
        parsers.duration,
        "How long before a `context.wait_for_event(...)` began an event may have been "
        "emitted and still count for it (the wait's `lookback=` overrides it).",
        checks="django_pgjobs.E012",
    )
    EVENT_RETENTION = Setting(
        7 * 86400.0,
        parsers.duration,
        "How long events (`emit_event`) are kept before the pruner deletes them. Must be "
        "at least `EVENT_LOOKBACK`.",
        checks="django_pgjobs.E012",
    )
    BATCH_ABANDONED_AFTER = Setting(
        3600.0,
        parsers.duration,
        "A `with batch(...)` block that never closed its batch (its process died inside "
        "it) is taken as abandoned once no member has joined for this long: the workflow "
        "repair pass then closes the batch, counting the members that joined. Keep it "
        "above the longest pause between two enqueues inside a block.",
    )
    CRON = Setting(
        {},
        parsers.mapping("name -> schedule", "`dict` name → schedule"),
        "Recurring jobs (see below).",
        checks="django_pgjobs.E004 django_pgjobs.E005",
    )
    CRON_ENGINE = Setting(
        "builtin",
        parsers.choice("builtin", "pg_cron"),
        'Who enqueues the recurring jobs: every `runjobs` process (`"builtin"`), or '
        'pg_cron after `sync_cron --pg-cron` (`"pg_cron"`, and then `runjobs` does not '
        "tick).",
    )
    LISTEN = Setting(
        True,
        parsers.flag,
        "Idle workers sleep on `LISTEN pgjobs` and wake at the `NOTIFY` an enqueue sends. "
        "Set `False` behind pgbouncer in transaction mode (see {doc}`../howto/pgbouncer`).",
    )
    PREPARE = Setting[bool | str](
        "auto",
        parsers.choice("auto", True, False),
        "Whether the hot statements (claim, complete, heartbeat, single enqueue) run as "
        "server-side prepared statements on the worker's and enqueuer's own cursor. "
        '`"auto"` prepares unless the connection goes through a pooler that cannot keep '
        "them (pgbouncer before 1.21 in transaction mode): it compares the server's own "
        "`port` setting with the port the client connected to (a pooler listens on "
        'another one), respects `DATABASES[...]["OPTIONS"]["prepare_threshold"] = None`, '
        "prepares only statements run in autocommit, and switches itself off for the "
        "process (logging a warning) if the server ever reports a lost prepared "
        "statement. Independent of Django's `server_side_binding`. Set `True` for "
        "pgbouncer ≥ 1.21 with `max_prepared_statements`, `False` to never prepare.",
    )
    MAX_ARGS_BYTES = Setting(
        1_048_576,
        parsers.whole,
        "Largest JSON encoding of one job's arguments accepted at enqueue (`.enqueue`, "
        "`enqueue_many`, `Job.objects.enqueue`, the Tasks backend): a larger one raises "
        "`ValueError` naming the largest argument, and nothing is written. "
        "`pgjobs_enqueue` reads the PostgreSQL setting `pgjobs.max_args_bytes` instead "
        "(same default). Both count the same bytes: the UTF-8 of the arguments' JSON "
        "text as PostgreSQL prints the stored value (`args::text` plus `kwargs::text`; "
        "`é` is 2 bytes).",
    )
    MAX_RESULT_BYTES = Setting(
        1_048_576,
        parsers.whole,
        "Largest JSON encoding of a job's return value (UTF-8 bytes, counted like "
        "`MAX_ARGS_BYTES`); a larger one dead-letters that job (no retry) with an error "
        "saying so.",
    )
    MAX_STEPS = Setting(
        1000,
        parsers.whole,
        "Most steps (steps, atomic steps, sleeps, waits) one durable job records; the "
        "run that asks for one more is dead-lettered with an error saying so.",
    )
    MAX_ERRORS_KEPT = Setting(
        20,
        parsers.whole,
        "Error entries kept per job (the oldest are dropped first) by retries, dead "
        "letters, the reaper and admin retries; the admin detail page shows this many "
        "newest entries.",
    )
    DEFAULT_TIMEOUT = Setting(
        None,
        parsers.optional_duration,
        "How long a run may take when `@job(timeout=...)` does not say; `None` is no limit.",
    )
    UNKNOWN_TASK_TIMEOUT = Setting(
        3600.0,
        parsers.duration,
        "A job whose task no live worker has known for this long is dead-lettered as "
        '"unknown task" (during a rolling deploy it waits instead).',
    )
    QUEUES = Setting(
        {},
        parsers.mapping("queue name -> options", "`dict` name → options"),
        "Per-queue limits written into the `Queue` table at `migrate` and at worker "
        'start: `max_running` (whole number ≥ 1), `rate` (`"N/s"`, `"N/m"` or '
        '`"N/h"`), `paused` (`bool`), `weights` (fair key → whole number 1-1000, the '
        "share of each key's turn; a key not named weighs 1). The keys an entry names "
        "overwrite the row's; a `paused` left out keeps a pause set at runtime. See "
        "{doc}`../howto/control-throughput`.",
        checks="django_pgjobs.E010",
    )
    JOB_MODULES = Setting(
        [],
        parsers.module_list,
        "Modules imported at startup (in `AppConfig.ready`, after every app's `jobs` "
        "module), for `@job` functions that live elsewhere. A module that cannot be "
        "imported stops startup with `ImproperlyConfigured` naming it.",
    )
    HEALTH_STUCK_AFTER = Setting(
        600.0,
        parsers.optional_duration,
        "`runjobs --health-file` stops touching its file when every job slot (every "
        "thread, or every event-loop slot) has run the same job for longer than this and "
        "longer than that job's `timeout`, so a liveness probe restarts a worker that is "
        "alive but runs nothing. Set it above your longest job that has no timeout; "
        "`None` checks the heartbeat only. See {doc}`../howto/deploy-workers`.",
    )
    METRICS_PORT = Setting(
        None,
        parsers.optional_port,
        "`runjobs` serves Prometheus metrics at `/metrics` on this port "
        "(`runjobs --metrics-port` overrides it).",
    )
    METRICS_ADDRESS = Setting(
        "127.0.0.1",
        parsers.listen_address,
        "The address `/metrics` listens on (`runjobs --metrics-address` overrides it). "
        "The default serves this host only, so nothing is exposed to the network "
        'unless you ask: set `"0.0.0.0"` (or `"::"`) when Prometheus scrapes from '
        "another host or pod. See {doc}`metrics`.",
    )

    def __init__(self, values: Mapping[str, Any]) -> None:
        vars(self).update(values)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"the PGJOBS settings are read-only (set PGJOBS['{name}'] instead)")

    def __repr__(self) -> str:
        return f"PgJobsSettings({vars(self)!r})"

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _declared() -> Iterator[Setting[Any]]:
    for value in vars(PgJobsSettings).values():
        if isinstance(value, Setting):
            yield value


#: Every key, in the order of the reference page.
SETTINGS: tuple[Setting[Any], ...] = tuple(_declared())
BY_NAME = {s.name: s for s in SETTINGS}
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}


def raw_settings() -> dict[str, Any]:
    value = getattr(django_settings, "PGJOBS", None) or {}
    if not isinstance(value, dict):
        raise SettingsError(f"PGJOBS must be a dict, got {type(value).__name__}")
    return value


def unknown_key_message(key: Any) -> str:
    """``PGJOBS has an unknown key 'x'`` with a suggestion (also for a lowercase key)."""
    text = str(key)
    if text.upper() in BY_NAME:
        return (
            f"PGJOBS has an unknown key {key!r}: keys are upper case. "
            f"Did you mean {text.upper()!r}?"
        )
    return f"PGJOBS has an unknown key {key!r}.{suggest(text, set(BY_NAME))}"


def settings_errors(user: dict[str, Any]) -> list[SettingsError]:
    """Every problem at once (the system check reports each): one error per unknown key,
    then one per bad value."""
    errors = [SettingsError(unknown_key_message(k)) for k in user if k not in BY_NAME]
    for key, value in user.items():
        if key in BY_NAME:
            try:
                BY_NAME[key].parse(value)
            except SettingsError as exc:
                errors.append(exc)
    return errors


def build_settings(user: dict[str, Any]) -> PgJobsSettings:
    """Parse ``user`` over the defaults; raise ``SettingsError`` naming the first bad key
    (``settings_errors`` lists them all)."""
    for key in user:
        if key not in BY_NAME:
            raise SettingsError(unknown_key_message(key))
    return PgJobsSettings({s.name: s.parse(user.get(s.name, s.default)) for s in SETTINGS})


_cached: PgJobsSettings | None = None


def get_settings() -> PgJobsSettings:
    """The effective settings (cached; cleared when a test overrides ``PGJOBS``)."""
    global _cached
    if _cached is None:
        _cached = build_settings(raw_settings())
    return _cached


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == "PGJOBS":
        _cached = None


# ---------------------------------------------------------------------------
# Environment variables the package reads
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvironmentVariable(Generic[T]):
    name: str
    default: str
    parser: Parser[T]
    doc: str

    def value(self) -> T:
        """The parsed value, read now; ``SettingsError`` naming the variable if bad."""
        text = os.environ.get(self.name, self.default)
        return self.parser.parse(text, f"the environment variable {self.name}")


METRICS_INTERVAL = EnvironmentVariable(
    "PGJOBS_METRICS_INTERVAL",
    "10",
    parsers.interval_text,
    "Seconds between two reads of the queue gauges by `runjobs --metrics-port` "
    "(see {doc}`metrics`).",
)

ENVIRONMENT: tuple[EnvironmentVariable[Any], ...] = (METRICS_INTERVAL,)


def environment_errors() -> list[SettingsError]:
    """A ``SettingsError`` per environment variable with a bad value (check E002)."""
    errors = []
    for variable in ENVIRONMENT:
        try:
            variable.value()
        except SettingsError as exc:
            errors.append(exc)
    return errors


# ---------------------------------------------------------------------------
# The reference page's tables
# ---------------------------------------------------------------------------


def reference_tables() -> str:
    """The generated block of ``docs/reference/settings.md``: every key, then every
    environment variable (``tests/unit/test_settings_page.py`` keeps the page equal to it)."""
    lines = [
        "| Key | Type | Default | Check | Meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        checks = ", ".join(f"`{c}`" for c in s.checks)
        lines.append(
            f"| `{s.name}` | {s.parser.kind} | {s.parser.show(s.default)} | {checks} | {s.doc} |"
        )
    lines += [
        "",
        "Environment variables (each checked by `django_pgjobs.E002` too):",
        "",
        "| Variable | Type | Default | Meaning |",
        "|---|---|---|---|",
    ]
    for v in ENVIRONMENT:
        lines.append(f"| `{v.name}` | {v.parser.kind} | {v.parser.show(v.default)} | {v.doc} |")
    return "\n".join(lines) + "\n"
