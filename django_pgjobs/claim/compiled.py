"""The plain claims' statements: ``Job.objects.claimable()`` compiled into the inner
query of the ``JOB_CLAIM_*`` statements around their hand-written parts
(``plain.py``), once per database vendor, by an explicit call
(``claim_statements``).

Why not in ``db/``: compiling needs the model's queryset, and ``db/`` sits below the
models (``Job.objects`` runs its statements). The claim package sits above them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField
from django.db.models.expressions import RawSQL

from django_pgjobs.claim.plain import (
    CLAIM_STATEMENTS,
    claim_all,
    claim_levels,
    claim_one_queue,
    claim_queues,
)
from django_pgjobs.conf import get_settings
from django_pgjobs.jobs.managers import StatementParam
from django_pgjobs.states import JobStatus

# The LIMIT compiled into the queryset (Django writes it as a literal), replaced by
# %(n)s; no real claim asks for this many rows.
_LIMIT_MARK = 1_999_999_999
_PLACEHOLDER = re.compile(rf"%%|%s|LIMIT {_LIMIT_MARK}\b")
_STATUSES = frozenset(s.value for s in JobStatus)

# vendor -> statement name -> text
_claims: dict[str, dict[str, str]] = {}


def claim_statements(connection: Any = None) -> dict[str, str]:
    """The claim statements (``CLAIM_STATEMENTS`` -> text) for ``connection``'s
    database vendor (None, or a plain psycopg connection: the ``PGJOBS["DATABASE"]``
    one's), compiled from ``Job.objects.claimable`` on first use."""
    vendor = getattr(connection, "vendor", None)
    statements = _claims.get(vendor) if vendor is not None else None
    if statements is None:
        if vendor is None:
            connection = connections[get_settings().DATABASE]
            vendor = connection.vendor
        statements = _claims.get(vendor)
        if statements is None:
            statements = _claims[vendor] = compile_claims(connection)
    return statements


def compile_claims(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """Compile the claim statements with ``connection``'s backend (never connecting)."""
    # Not at import: the claim package may be imported before the app registry is
    # ready (the test settings set the claim front's probe interval); the model
    # exists only then.
    from django_pgjobs.models import Job

    offline = _offline(connection)

    def picked(queue: Any, known: bool, *columns: str, priority: Any = None) -> str:
        tasks = StatementParam("tasks") if known else None
        since = StatementParam("since", DateTimeField())
        queryset = Job.objects.claimable(queue, tasks=tasks, since=since, priority=priority)
        queryset = queryset.values(*columns)[:_LIMIT_MARK]
        text, params = queryset.query.get_compiler(connection=offline).as_sql()
        return _named(text, params)

    out: dict[str, str] = {}
    for suffix, known in (("", False), ("_KNOWN", True)):
        lateral = picked(RawSQL("qs.name", ()), known, "id", "priority", "run_at")
        out["JOB_CLAIM_ONE_QUEUE" + suffix] = claim_one_queue(
            picked(StatementParam("queue"), known, "id")
        )
        out["JOB_CLAIM_QUEUES" + suffix] = claim_queues(lateral)
        out["JOB_CLAIM_ALL" + suffix] = claim_all(lateral)
        by_level = picked(
            RawSQL("qs.name", ()), known, "id", "priority", "run_at", priority=RawSQL("lv.p", ())
        )
        out["JOB_CLAIM_LEVELS" + suffix] = claim_levels(by_level)
    return {name: out[name] for name in CLAIM_STATEMENTS}


def _named(text: str, params: Sequence[Any]) -> str:
    """Compiled SQL with its positional parameters made named: a ``StatementParam``
    becomes ``%(name)s``, the LIMIT mark ``%(n)s``, and a job status a literal. The
    status must be a literal: only then can the planner match the partial claim index
    (``WHERE status = 'pending'``), also in a prepared statement's generic plan."""
    values = iter(params)
    limits = 0

    def one(match: re.Match[str]) -> str:
        nonlocal limits
        if match.group() == "%%":
            return "%%"
        if match.group().startswith("LIMIT"):
            limits += 1
            return "LIMIT %(n)s"
        value = next(values)
        if isinstance(value, StatementParam):
            return f"%({value.name})s"
        if isinstance(value, str) and value in _STATUSES:
            return f"'{value}'"
        raise ValueError(f"the claim queryset has a parameter the claim cannot pass: {value!r}")

    named = _PLACEHOLDER.sub(one, text)
    if next(values, None) is not None or limits != 1:
        raise ValueError(f"unexpected shape of the compiled claim queryset: {text}")
    return named


def _offline(connection: BaseDatabaseWrapper) -> BaseDatabaseWrapper:
    """A wrapper of ``connection``'s backend that compiles SQL and never connects.
    Django's compiler asks whether a select_for_update() queryset runs inside a
    transaction (asking opens a connection, and the answer is no in autocommit);
    this one answers yes: the compiled text only ever runs inside the claim's
    own statement, which is its transaction."""

    def ensure_connection(self: Any) -> None:
        raise RuntimeError("compiling the claim queryset must not need a connection")

    if not isinstance(connection, BaseDatabaseWrapper):  # django.db.connection, a proxy
        connection = connections[connection.alias]
    backend = type(
        "OfflineCompiler",
        (type(connection),),
        {"ensure_connection": ensure_connection, "get_autocommit": lambda self: False},
    )
    offline: BaseDatabaseWrapper = backend(connection.settings_dict, alias=connection.alias)
    return offline
