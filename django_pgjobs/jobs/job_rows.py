"""The ``Job`` an enqueue returns: built from what it sent plus the server's id and
times (``new_job``: parsing every column back costs a real share of an enqueue), or
from a whole row a statement returned (``row_to_job``), with times as the ORM gives
them."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import JSONField
from django.utils import timezone

from django_pgjobs.db.epoch import from_epoch_us

if TYPE_CHECKING:
    from django_pgjobs.models import Job


@functools.cache
def columns(model: type[Job]) -> tuple[list[str], str, frozenset[int]]:
    """The job model's attribute names, its column list (for the statements that return
    whole rows) and the positions of its JSON columns (the model is passed in: this
    package sits below the models, which enqueue through it)."""
    fields = model._meta.concrete_fields
    attnames = [f.attname for f in fields]
    names = ", ".join(str(f.column) for f in fields)
    json_positions = frozenset(i for i, f in enumerate(fields) if isinstance(f, JSONField))
    return attnames, names, json_positions


@functools.cache
def returning_rows(model: type[Job], template: str) -> str:
    """A statement of ``db/`` that returns whole rows (``{columns}``), with the model's
    column list filled in once."""
    return template.format(columns=columns(model)[1])


def row_to_job(model: type[Job], alias: str, row: Sequence[Any]) -> Job:
    """A ``Job`` from a whole row (``columns``' order; trailing values are ignored)."""
    attnames, _, json_positions = columns(model)
    values: list[Any] = [
        as_django_time(v) if isinstance(v, datetime) else v for v in row[: len(attnames)]
    ]
    for i in json_positions:  # Django's psycopg setup loads jsonb as text
        if isinstance(values[i], str):
            values[i] = json.loads(values[i])
    return model.from_db(alias, attnames, values)


def as_django_time(value: datetime) -> datetime:
    """A time as the ORM returns it: aware with ``USE_TZ``, else naive in ``TIME_ZONE``
    (so ``enqueue()`` and a fresh ``Job.objects.get()`` agree, and both compare with
    ``timezone.now()``)."""
    if not settings.USE_TZ and timezone.is_aware(value):
        return timezone.make_naive(value, timezone.get_default_timezone())
    return value


def _from_epoch_us(microseconds: int) -> datetime:
    value = from_epoch_us(microseconds)
    if value is None:  # enqueue() writes only times a datetime holds
        raise ValueError(f"the server returned a time no datetime holds: {microseconds}")
    return as_django_time(value)


def new_job(
    model: type[Job],
    alias: str,
    row: Sequence[Any],
    task: str,
    opts: Mapping[str, Any],
    args: list[Any],
    kwargs: dict[str, Any],
    trace_context: dict[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Job:
    """The inserted row, built from what we sent plus the server's (id, run_at,
    created_at): returning and parsing every column is a real share of a single enqueue.
    The other columns hold their db_default values (test_enqueue checks the two agree)
    or, for a workflow job, ``overrides`` (status, workflow columns)."""
    attnames = columns(model)[0]
    values = {
        "id": row[0],
        "task": task,
        "queue": opts["queue"],
        "priority": opts["priority"],
        "args": args,
        "kwargs": kwargs,
        "status": "pending",
        "run_at": _from_epoch_us(row[1]),
        "created_at": _from_epoch_us(row[2]),
        "started_at": None,
        "finished_at": None,
        "heartbeat_at": None,
        "attempts": 0,
        "max_attempts": opts["max_attempts"],
        "lease": 0,
        "worker": None,
        "idempotency_key": opts["idempotency_key"],
        "errors": [],
        "last_error": None,
        "timeout": opts["timeout"],
        "concurrency_key": opts.get("concurrency_key"),
        "concurrency_limit": opts.get("concurrency_limit"),
        "fair_key": opts.get("fair_key"),
        "unique_key": opts.get("unique_key"),
        "trace_context": trace_context,
        "workflow_id": opts.get("workflow_id"),
        "node": None,
        "waiting": None,
        "failed_parents": None,
        "cancelled_by": None,
        "suspect": False,
        "waiting_for": None,
        "wakes": 0,
        "debounce_until": None,
        "chunk_run": None,
        **(overrides or {}),
    }
    job = model.from_db(alias, attnames, [values[name] for name in attnames])
    # A mark on this instance (an existing key's job has none), read by the Tasks backend.
    job._pgjobs_inserted = True  # type: ignore[attr-defined]
    return job
