"""Putting jobs in the table, inside the caller's transaction.

No ``transaction.on_commit``: the INSERT joins whatever transaction the caller
has open, so the job commits exactly when the business data does. One statement
inserts the row and queues the wake-up NOTIFY (delivered only at commit).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.utils import timezone

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness
from django_pgjobs.db.cursor import hot_cursor
from django_pgjobs.db.notify import JOB_NOTIFY_DUE
from django_pgjobs.db.store import (
    DELAYED_RUN_AT,
    JOB_BY_KEY,
    JOB_BY_UNIQUE_KEY,
    insert_params,
    job_copy,
    job_insert,
)
from django_pgjobs.jobs import debounce, keys, registry
from django_pgjobs.jobs.definition import stored_timeout
from django_pgjobs.jobs.job_rows import new_job, returning_rows, row_to_job
from django_pgjobs.support import tracing
from django_pgjobs.support.validation import (
    check_arguments,
    check_options,
    check_size,
    json_bytes,
    json_text,
)

if TYPE_CHECKING:
    from django_pgjobs.jobs.definition import JobDefinition
    from django_pgjobs.models import Job

#: The fair key of a job without one in a queue that is claimed fairly: such jobs take
#: their turn together, as one key.
NO_FAIR_KEY = ""

#: Rows per COPY batch in ``enqueue_many``.
BULK_BATCH = 5000

#: The batch (``workflows.batch``) that jobs enqueued here join: its workflow row's
#: id, set for the duration of a ``with batch(...)`` block in this context.
CURRENT_BATCH: ContextVar[int | None] = ContextVar("pgjobs_current_batch", default=None)


def _json_text(value: list[Any] | dict[str, Any]) -> str:
    """JSON text for a jsonb column; the common no-argument cases skip the encoder
    (json.dumps was a third of enqueue_many's Python time for no-argument jobs)."""
    if not value:
        return "[]" if isinstance(value, list) else "{}"
    return json_text(value)


def _checked_json(
    definition: JobDefinition, args: list[Any], kwargs: dict[str, Any]
) -> tuple[str, str]:
    """The arguments checked against the signature, encoded, and checked against
    ``MAX_ARGS_BYTES``: what every enqueue path does before it writes a row."""
    check_arguments(
        definition.checked_func,
        definition.name,
        args,
        kwargs,
        takes_context=definition.checked_takes_context,
    )
    args_text, kwargs_text = _json_text(args), _json_text(kwargs)
    check_size(
        definition.checked_func,
        definition.name,
        args,
        kwargs,
        json_bytes(args_text) + json_bytes(kwargs_text),
        takes_context=definition.checked_takes_context,
    )
    return args_text, kwargs_text


def resolve_options(definition: JobDefinition, options: Mapping[str, Any]) -> dict[str, Any]:
    """Definition defaults overlaid with per-call options, ready for the INSERT."""
    run_at: datetime | None = options.get("run_at")
    if run_at is not None and timezone.is_naive(run_at):
        # Only accepted with USE_TZ = False (check_run_at): a time in TIME_ZONE.
        run_at = timezone.make_aware(run_at, timezone.get_default_timezone())
    # A delay is added to the database's now() (JOB_INSERT_DELAYED), the clock
    # every other time of a job comes from.
    delay: timedelta | None = options.get("delay") if run_at is None else None
    max_attempts = options.get("max_attempts") or definition.max_attempts
    return {
        "queue": options.get("queue", definition.queue),
        "priority": options.get("priority", definition.priority),
        "run_at": run_at,
        "delay": delay,
        "max_attempts": max_attempts or get_settings().MAX_ATTEMPTS,
        "idempotency_key": options.get("idempotency_key"),
        # Stored only when given per call (None as Infinity: no limit); else the
        # worker falls back to the @job option, then PGJOBS["DEFAULT_TIMEOUT"]
        # (JobDefinition.effective_timeout).
        "timeout": stored_timeout(options),
        "unique_key": options.get("unique_key"),
        "workflow_id": CURRENT_BATCH.get(),
    }


@readiness.names_the_fix("enqueue")
def enqueue_one(
    definition: JobDefinition,
    args: list[Any],
    kwargs: dict[str, Any],
    options: Mapping[str, Any],
    *,
    model: type[Job],
    using: str | None = None,
) -> Job:
    """Validate, then insert one job (or return the job that already owns its key).

    ``model``: the job model, whose rows come back (``Job``; passed in by the callers
    above the models: ``JobFunction``, ``Job.objects``, the Tasks backend)."""
    args_text, kwargs_text = _checked_json(definition, args, kwargs)
    opts = resolve_options(definition, options)
    alias = using or get_settings().DATABASE
    # A Tasks backend task's own debounce comes per call (its definition is shared).
    plan = options.get("debounce") or definition.debounce
    if plan is not None:
        debounce.check_call(options, definition.name)
        flow_keys(definition, args, kwargs, opts)
        texts = (args_text, kwargs_text)
        return debounce.enqueue(definition, plan, texts, args, kwargs, opts, model, alias)
    by_key = returning_rows(model, JOB_BY_KEY)
    by_unique_key = returning_rows(model, JOB_BY_UNIQUE_KEY)
    flow = (
        definition.concurrency_key is not None
        or definition.unique_while is not None
        or opts["unique_key"] is not None
        or fair_queue(definition, opts["queue"])
    )
    # A key is taken: the job that holds it is returned, and nothing is written.
    lookups = [(by_key, opts["idempotency_key"])]
    if flow:
        flow_keys(definition, args, kwargs, opts)
        lookups.append((by_unique_key, opts["unique_key"]))
        failure = f"could not enqueue {definition.name}: its key stayed taken"
    else:
        failure = (
            f"could not enqueue {definition.name} with idempotency key {opts['idempotency_key']!r}"
        )
    delay = opts["delay"]
    params = insert_params(
        task=definition.name,
        queue=opts["queue"],
        priority=opts["priority"],
        args=args_text,
        kwargs=kwargs_text,
        run_at=opts["run_at"],
        delay=None if delay is None else delay.total_seconds(),
        max_attempts=opts["max_attempts"],
        idempotency_key=opts["idempotency_key"],
        timeout=opts["timeout"],
        concurrency_key=opts.get("concurrency_key"),
        concurrency_limit=opts.get("concurrency_limit"),
        fair_key=opts.get("fair_key"),
        unique_key=opts.get("unique_key"),
        workflow_id=opts.get("workflow_id"),
    )
    # OpenTelemetry (support/tracing.py): a send span, whose context the row stores. A
    # shared no-op context when tracing is off.
    with (
        tracing.publish(definition.name, opts["queue"]) as publish,
        hot_cursor(connections[alias]) as cursor,
    ):
        carrier = publish.carrier if publish is not None else None
        params["trace_context"] = None if carrier is None else json.dumps(carrier)
        # Three tries: the holder of a key can finish or be pruned between the
        # insert and the lookup, freeing the key.
        for _ in range(3):
            row = job_insert(cursor, params, flow=flow, delayed=delay is not None)
            if row is not None:
                if publish is not None:
                    publish.set_message_id(row[0])
                return new_job(model, alias, row, definition.name, opts, args, kwargs, carrier)
            for lookup, key in lookups:
                if key is not None:
                    cursor.execute(lookup, [key])
                    row = cursor.fetchone()
                    if row is not None:
                        return row_to_job(model, alias, row)
    raise RuntimeError(failure)


def flow_keys(
    definition: JobDefinition, args: list[Any], kwargs: dict[str, Any], opts: dict[str, Any]
) -> None:
    """Compute the concurrency key, the fair key and the unique_while key (keys.py)
    into ``opts``.

    The flow members of JOB_INSERT say ``ON CONFLICT DO NOTHING``, which covers both
    unique indexes: a concurrent enqueue of the same unique key waits for the other
    transaction and then writes nothing, so two racing enqueues make one row. The
    caller then gets the job that holds the key (or the idempotency key).
    """
    keys.format_check(definition, args, kwargs)
    ckey = keys.concurrency_key(definition, args, kwargs)
    opts["concurrency_key"] = ckey
    opts["concurrency_limit"] = definition.concurrency_limit if ckey is not None else None
    opts["fair_key"] = stored_fair_key(definition, args, kwargs, opts["queue"])
    opts["unique_key"] = keys.unique_key(definition, args, kwargs, opts.get("unique_key"))


def fair_queue(definition: JobDefinition, queue: str) -> bool:
    """Whether a job of ``definition`` enqueued to ``queue`` gets a fair key: its task
    declares one, or the queue is claimed fairly (another task's default queue with a
    fair key, or weights in ``PGJOBS["QUEUES"]``)."""
    if definition.fair_key is not None:
        return True
    if queue in registry.fair_queues():
        return True
    entry = get_settings().QUEUES.get(queue)
    return isinstance(entry, dict) and bool(entry.get("weights"))


def stored_fair_key(
    definition: JobDefinition, args: list[Any], kwargs: dict[str, Any], queue: str
) -> str | None:
    """The fair key of one call: the task's, else ``NO_FAIR_KEY`` in a fair queue (so
    that the jobs without a key take their turn with the keyed ones), else None."""
    key = keys.fair_key(definition, args, kwargs)
    if key is None and fair_queue(definition, queue):
        return NO_FAIR_KEY
    return key


def enqueue_by_name(
    task: str,
    *,
    model: type[Job],
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    using: str | None = None,
    **options: Any,
) -> Job:
    """``Job.objects.enqueue("app.jobs.name", args=[...], ...)``: only registered names
    (``model``: the manager's)."""
    if not isinstance(task, str):
        raise TypeError(f"task must be the registered name of a @job (str), got {task!r}")
    if args is not None and not isinstance(args, list | tuple):
        raise TypeError(f"args of {task} must be a list, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs of {task} must be a dict, got {type(kwargs).__name__}")
    definition = registry.get(task)
    checked = check_options(options)
    return enqueue_one(
        definition, list(args or []), dict(kwargs or {}), checked, model=model, using=using
    )


def split_call(item: Any, task: str, index: int) -> tuple[list[Any], dict[str, Any]]:
    if (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[1], dict)
        and isinstance(item[0], list | tuple)
    ):
        return list(item[0]), dict(item[1])
    if isinstance(item, list | tuple):
        return list(item), {}
    raise TypeError(
        f"enqueue_many item {index} of {task} must be a tuple of arguments "
        f"or an (args, kwargs) pair, got {type(item).__name__}"
    )


@readiness.names_the_fix("enqueue_many")
def enqueue_batch(
    definition: JobDefinition,
    calls: Iterable[Any],
    options: Mapping[str, Any],
    *,
    using: str | None = None,
) -> int:
    """Validate every call first, then COPY them in batches inside one transaction."""
    if options.get("idempotency_key") is not None:
        raise ValueError(
            "enqueue_many cannot take an idempotency_key (it would name every job in the batch);"
            " enqueue keyed jobs one by one with .using(idempotency_key=...).enqueue()"
        )
    if isinstance(calls, str | bytes | Mapping):
        raise TypeError(
            f"enqueue_many takes an iterable of argument tuples, got {type(calls).__name__}"
        )
    if definition.unique_while is not None:
        raise ValueError(
            f"enqueue_many cannot enqueue {definition.name}: it is @job(unique_while=...), and "
            "each enqueue must check its key; enqueue it one by one with .enqueue()"
        )
    opts = resolve_options(definition, options)
    rows: list[tuple[Any, ...]] = []
    with_run_at = opts["run_at"] is not None or opts["delay"] is not None
    keyed = definition.concurrency_key is not None
    fair = fair_queue(definition, opts["queue"])
    for index, item in enumerate(calls):
        args, kwargs = split_call(item, definition.name, index)
        try:
            args_text, kwargs_text = _checked_json(definition, args, kwargs)
            row: tuple[Any, ...] = (
                definition.name,
                opts["queue"],
                opts["priority"],
                args_text,
                kwargs_text,
                opts["max_attempts"],
            )
            if keyed:
                keys.format_check(definition, args, kwargs)
                ckey = keys.concurrency_key(definition, args, kwargs)
                row = (*row, ckey, None if ckey is None else definition.concurrency_limit)
            if fair:
                keys.format_check(definition, args, kwargs)
                row = (*row, stored_fair_key(definition, args, kwargs, opts["queue"]))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"enqueue_many item {index}: {exc}") from None
        rows.append(row)
    if not rows:
        return 0
    columns = "task, queue, priority, args, kwargs, max_attempts"
    if keyed:
        columns += ", concurrency_key, concurrency_limit"
    if fair:
        columns += ", fair_key"
    if opts["timeout"] is not None:
        rows = [(*row, opts["timeout"]) for row in rows]
        columns += ", timeout"
    if opts["workflow_id"] is not None:  # inside a batch() block: every row joins it
        rows = [(*row, opts["workflow_id"]) for row in rows]
        columns += ", workflow_id"
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    # savepoint=False: inside a caller's atomic() this adds no SAVEPOINT round trips.
    with (
        tracing.publish(definition.name, opts["queue"], len(rows)) as publish,
        transaction.atomic(using=alias, savepoint=False),
        connection.cursor() as cursor,
    ):
        if publish is not None and publish.carrier is not None:
            # One send span for the batch: every job's span is its child.
            columns += ", trace_context"
            context_text = json.dumps(publish.carrier)
            rows = [(*row, context_text) for row in rows]
        run_at = opts["run_at"]
        if opts["delay"] is not None:  # the database's clock, as for a single enqueue
            cursor.execute(DELAYED_RUN_AT, [opts["delay"].total_seconds()])
            run_at = cursor.fetchone()[0]
        if with_run_at:  # last, as each row gets it last below
            columns += ", run_at"
        if with_run_at:
            rows = [(*row, run_at) for row in rows]
        for start in range(0, len(rows), BULK_BATCH):
            job_copy(cursor, columns, rows[start : start + BULK_BATCH])
        cursor.execute(
            JOB_NOTIFY_DUE,
            {"queue": opts["queue"], "run_at": run_at, "priority": opts["priority"]},
        )
    return len(rows)
