"""The cursor layer: the reused, prepared-statement cursor of the hot path
(``hot_cursor``), a transaction on either kind of connection (``atomic``), and the
decoding of the jsonb Django hands back as text."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg
import psycopg.errors
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs.conf import get_settings
from django_pgjobs.support import decoding

#: What the statement functions that take it run on: Django's connection, or a plain
#: psycopg connection (the fault suite and the benchmark drive them with their own).
#: Functions that need Django's transactions or query logging take BaseDatabaseWrapper.
#: Tell them apart by the psycopg class: ``django.db.connection`` is a proxy, not a
#: BaseDatabaseWrapper instance.
Connection: TypeAlias = "BaseDatabaseWrapper | psycopg.Connection[Any]"


class _PreparedCursor:
    """A psycopg cursor whose ``execute`` sends hot statements as named prepared
    statements (parsed and planned once per connection), whatever Django's own
    ``server_side_binding`` says. Falls back to unprepared execution for good when
    the server says a prepared statement is missing (a transaction pooler)."""

    __slots__ = ("cursor", "wrapper")

    def __init__(self, cursor: Any, wrapper: BaseDatabaseWrapper):
        self.cursor = cursor
        self.wrapper = wrapper

    def execute(self, statement: str, params: Any = None) -> Any:
        try:
            return self.cursor.execute(statement, params, prepare=True)
        except (
            psycopg.errors.InvalidSqlStatementName,
            psycopg.errors.DuplicatePreparedStatement,
        ) as exc:
            _disable_prepare(
                f"the server lost a prepared statement ({exc}); probably a transaction pooler"
            )
            if not self.wrapper.get_autocommit():
                raise
            return self.cursor.execute(statement, params, prepare=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


_prepare_disabled = False


def _disable_prepare(reason: str) -> None:
    global _prepare_disabled
    if not _prepare_disabled:
        logging.getLogger("django_pgjobs").warning(
            "prepared statements switched off for this process: %s "
            "(set PGJOBS['PREPARE'] = False to say so up front)",
            reason,
        )
    _prepare_disabled = True


def _may_prepare(connection: BaseDatabaseWrapper, raw: Any) -> bool:
    """PGJOBS["PREPARE"]: True, False, or "auto": prepare unless the server we talk
    to listens on another port than the one we connected to (a pooler such as
    pgbouncer in front of it; pgbouncer < 1.21 in transaction mode cannot keep
    prepared statements). Checked once per connection."""
    setting = get_settings().PREPARE
    if setting is False or (setting == "auto" and _prepare_disabled):
        return False
    if setting == "auto":
        options = connection.settings_dict.get("OPTIONS") or {}
        if "prepare_threshold" in options and options["prepare_threshold"] is None:
            return False  # the project switched psycopg's prepared statements off itself
        with raw.cursor() as cursor:
            cursor.execute("SELECT current_setting('port')")
            row = cursor.fetchone()
        try:
            if row is None or int(row[0]) != int(raw.info.port):
                return False
        except (TypeError, ValueError):
            return False
    if raw.prepare_threshold is None:
        # Django's client-side binding leaves psycopg's preparing off; turn it on
        # for our explicit prepare=True only (no count ever reaches the threshold).
        raw.prepare_threshold = 2**31 - 1
    return True


@contextmanager
def hot_cursor(connection: Connection) -> Iterator[Any]:
    """A cursor for the hot path (enqueue, claim, complete) that is reused.

    Django's ``connection.cursor()`` builds a new psycopg cursor (with a copy of the
    adapters map) and a wrapper per call, a noticeable share of a single enqueue.
    This keeps Django's semantics that matter here — the connection is opened on
    demand, a broken atomic block is refused, and errors come out as django.db
    errors — and falls back to Django's cursor when queries are being logged
    (DEBUG, assertNumQueries) or ``connection.execute_wrapper`` wrappers are
    installed, so they still see every statement.

    Where ``PGJOBS["PREPARE"]`` allows, statements run as server-side prepared
    statements (in autocommit only under "auto": behind a pooler a prepared
    statement may vanish, and only outside a transaction can the statement be
    repeated unprepared).
    """
    if (
        isinstance(connection, psycopg.Connection)
        or connection.queries_logged
        or connection.execute_wrappers
    ):
        # A plain psycopg connection (the fault suite drives these functions with its
        # own), queries are logged, or wrappers are installed.
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    cached = getattr(connection, "_pgjobs_hot_cursor", None)
    if cached is None or cached[0] is not raw or cached[1].closed:
        with connection.wrap_database_errors:
            prepare = _may_prepare(connection, raw)
        # A server-side-binding cursor (Django's default is client-side binding,
        # which cannot prepare); it shares the connection's adapters.
        plain = psycopg.Cursor(raw) if prepare else raw.cursor()
        cached = (raw, plain, _PreparedCursor(plain, connection) if prepare else None)
        connection._pgjobs_hot_cursor = cached  # type: ignore[attr-defined]  # our cache on Django's object
    prepared = cached[2]
    use = (
        cached[1]
        if prepared is None or (_prepare_disabled or not connection.get_autocommit())
        else prepared
    )
    with connection.wrap_database_errors:
        yield use


def atomic(connection: Connection) -> Any:
    """A transaction (a savepoint when nested) on Django's connection, or on a plain
    psycopg connection (the fault suite drives these functions with its own)."""
    if isinstance(connection, psycopg.Connection):
        return connection.transaction()
    return transaction.atomic(using=connection.alias)


def int_array(values: Iterable[int]) -> str:
    """A ``bigint[]`` parameter as its text literal (the SQL casts it). psycopg dumps a
    list element by element in Python, which for a large completion's three arrays is a
    visible share of the worker's CPU in a no-op drain; a literal is joined in C."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array(values: Iterable[str | None]) -> str:
    """A ``text[]`` (or ``jsonb[]``) parameter as its text literal: NULL for None, each
    text double-quoted with its backslashes and double quotes escaped."""
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for v in values
        )
        + "}"
    )


def _json_value(value: Any, loads: Callable[[str | bytes], Any]) -> Any:
    # Empty args/kwargs are the common case; skipping json.loads for them was
    # measurable in a claim-loop profile (two decodes per claimed job).
    if value == "[]":
        return []
    if value == "{}":
        return {}
    return loads(value) if isinstance(value, str | bytes) else value


def json_value(value: Any) -> Any:
    """A jsonb value as Python: Django's psycopg setup loads jsonb as text (it decodes
    JSON in the ORM), a plain psycopg connection as Python already."""
    return _json_value(value, json.loads)


def json_value_or_placeholder(value: Any) -> Any:
    """``json_value``, with a value that cannot be decoded (a number of more than
    4,300 digits, absurd nesting) as an ``Undecodable`` placeholder for its row."""
    return _json_value(value, decoding.loads)
