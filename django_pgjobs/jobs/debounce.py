"""Debounce and keep-latest: ``@job(debounce=..., debounce_key=..., max_wait=..., keep=...)``.

An enqueue of a debounced job while a job with its key is pending adds no row: it
moves that job's ``run_at`` on to now + ``debounce`` (never past its first enqueue +
``max_wait``) and, with ``keep="latest"``, gives it the new arguments. This module
validates the options, computes the key of one call and runs the upsert.

The key rides on the ``unique_while="pending"`` machinery: it is stored as the row's
``unique_key`` in the ``"pending:"`` mode, so the partial unique index of active keys
makes concurrent enqueues of one key meet on one row (``db/job_insert.py`` upserts it
in one statement), and the claim frees the key when the job starts: an enqueue after
that makes a new job and leaves the running one alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_pgjobs.db.cursor import hot_cursor
from django_pgjobs.db.store import JOB_BY_UNIQUE_KEY, insert_params, job_debounce
from django_pgjobs.jobs.job_rows import columns, returning_rows, row_to_job
from django_pgjobs.jobs.keys import bound_arguments, check_key_option, check_template_fields
from django_pgjobs.support import tracing
from django_pgjobs.support.validation import MAX_DELAY, check_key, seconds_of

if TYPE_CHECKING:
    from django_pgjobs.jobs.definition import JobDefinition
    from django_pgjobs.models import Job

#: What ``keep`` may be: the newest enqueue's arguments, or the first one's.
KEEP = ("latest", "first")
#: The options of a debounced job (``@job`` and a Tasks backend task).
OPTIONS = ("debounce", "debounce_key", "max_wait", "keep")


@dataclass(frozen=True)
class Debounce:
    """A job's debounce, validated: seconds, key (format string or callable), the
    bound on the total delay (None: none) and which arguments the job keeps."""

    seconds: float
    key: str | Callable[..., Any]
    max_wait: float | None = None
    keep: str = "latest"

    @property
    def bound(self) -> float:
        """Seconds from the first enqueue past which run_at never moves (no max_wait:
        the longest delay a job may have)."""
        return MAX_DELAY.total_seconds() if self.max_wait is None else self.max_wait


def unbounded(first: datetime, until: datetime) -> bool:
    """Whether a job's ``debounce_until`` is the stand-in for "no max_wait" (the longest
    delay after its first enqueue at ``first``) rather than a real bound."""
    return until - first > MAX_DELAY - timedelta(days=1)


def _seconds(value: Any, option: str, task: str) -> float:
    seconds = seconds_of(value, f"{option} of {task}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DELAY.total_seconds():
        raise ValueError(
            f"{option} of {task} must be from 0 seconds to {MAX_DELAY.days} days, got {value!r}"
        )
    return seconds


def _check_template(key: Any, task: str) -> str | Callable[..., Any]:
    if not callable(key) and (not isinstance(key, str) or not key):
        raise TypeError(
            f"debounce_key of {task} must be a format string over the job's arguments "
            f'("reindex:{{doc_id}}") or a callable, got {key!r}'
        )
    check_key_option(key, "debounce_key", task, label="debounce_key")
    template: str | Callable[..., Any] = key
    return template


def check_debounce(options: Mapping[str, Any], task: str) -> Debounce | None:
    """Validate the debounce options of ``task`` (the ones not given are absent or
    None); None when the job is not debounced."""
    seconds = options.get("debounce")
    if seconds is None:
        given = [name for name in OPTIONS[1:] if options.get(name) is not None]
        if given:
            raise TypeError(f"{', '.join(given)} of {task} need debounce=... (how long to wait)")
        return None
    debounce = _seconds(seconds, "debounce", task)
    if options.get("debounce_key") is None:
        raise TypeError(
            f"debounce of {task} needs a debounce_key (the enqueues that share a key "
            'share one job), e.g. debounce_key="reindex:{doc_id}"'
        )
    key = _check_template(options["debounce_key"], task)
    max_wait = options.get("max_wait")
    bound = None if max_wait is None else _seconds(max_wait, "max_wait", task)
    if bound is not None and bound < debounce:
        raise ValueError(
            f"max_wait of {task} ({bound:g} s) must be at least its debounce ({debounce:g} s)"
        )
    keep = options.get("keep")
    if keep is None:
        keep = "latest"
    if keep not in KEEP:
        raise ValueError(f'keep of {task} must be "latest" or "first", got {keep!r}')
    if options.get("unique_while") is not None:
        raise ValueError(
            f"debounce and unique_while of {task} contradict each other: a debounced "
            "job already holds its key while it is pending; drop unique_while"
        )
    return Debounce(debounce, key, bound, str(keep))


def check_fields_exist(definition: JobDefinition, debounce: Debounce) -> None:
    """A format-string key must name parameters of the function (checked at decoration)."""
    if isinstance(debounce.key, str):
        check_template_fields(definition, debounce.key, f"debounce_key {debounce.key!r}")


def check_call(options: Mapping[str, Any], task: str) -> None:
    """Per-call options a debounced enqueue cannot honour, refused by name."""
    for name, why in (
        ("idempotency_key", "an idempotency key names one job forever"),
        ("unique_key", "the debounce_key is its key"),
        ("run_at", "its run_at is now + debounce"),
        ("delay", "its run_at is now + debounce"),
    ):
        if options.get(name) is not None:
            raise ValueError(f"{name} cannot be given to {task}, a debounced job: {why}")


def stored_key(
    definition: JobDefinition, debounce: Debounce, args: list[Any], kwargs: dict[str, Any]
) -> str:
    """The row's ``unique_key`` for one call: ``"pending:<task>:<key>"`` (the same
    text ``pgjobs_enqueue(debounce_key => ...)`` stores)."""
    key = debounce.key
    if callable(key):
        try:
            value = key(*args, **kwargs)
        except Exception as exc:
            raise ValueError(
                f"debounce_key of {definition.name} raised {type(exc).__name__}: {exc}"
            ) from exc
    else:
        try:
            value = key.format(**bound_arguments(definition, args, kwargs))
        except (KeyError, IndexError, AttributeError) as exc:
            raise ValueError(
                f"debounce_key {key!r} of {definition.name}: this call has no argument {exc}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"debounce_key of {definition.name} must give a string, got {value!r}")
    text = check_key(str(value), f"debounce_key of {definition.name}")
    return f"pending:{definition.name}:{text}"


def enqueue(
    definition: JobDefinition,
    plan: Debounce,
    texts: tuple[str, str],
    args: list[Any],
    kwargs: dict[str, Any],
    opts: dict[str, Any],
    model: type[Job],
    alias: str,
) -> Job:
    """Insert a debounced job, or move on the pending job that holds its key (one
    upsert, JOB_DEBOUNCE); returns that job, as it is now. ``texts``: the arguments
    checked and encoded; ``opts``: the call's options resolved, its keys computed."""
    key = stored_key(definition, plan, args, kwargs)
    params = insert_params(task=definition.name, args=texts[0], kwargs=texts[1])
    for name in ("queue", "priority", "max_attempts", "timeout", "workflow_id"):
        params[name] = opts[name]
    for name in ("concurrency_key", "concurrency_limit", "fair_key"):
        params[name] = opts.get(name)
    params |= {"unique_key": key, "delay": plan.seconds, "max_wait": plan.bound}
    params["keep_latest"] = plan.keep == "latest"
    by_unique_key = returning_rows(model, JOB_BY_UNIQUE_KEY)
    width = len(columns(model)[0])
    with (
        tracing.publish(definition.name, opts["queue"]) as publish,
        hot_cursor(connections[alias]) as cursor,
    ):
        carrier = publish.carrier if publish is not None else None
        params["trace_context"] = None if carrier is None else json.dumps(carrier)
        # Nothing returned: a blocked workflow job holds the key (read it); it may
        # finish, freeing the key, before the lookup: then try again.
        for _ in range(3):
            row = job_debounce(cursor, columns(model)[1], params)
            if row is None:
                cursor.execute(by_unique_key, [key])
                row = cursor.fetchone()
            if row is not None:
                job = row_to_job(model, alias, row)
                if len(row) > width and row[width]:  # this enqueue inserted it
                    job._pgjobs_inserted = True  # type: ignore[attr-defined]
                return job
    raise RuntimeError(f"could not enqueue {definition.name}: its debounce key stayed taken")
