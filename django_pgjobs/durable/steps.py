"""A durable job's step storage, for every kind of step: read one recorded step, record
one under the run's lease.

These are the calls a waiting primitive makes in its own transaction (a consumed
signal recorded as a step, with the consume, commits or rolls back as one):

* ``recorded(job_id, name, occurrence)``: the ``StepRow`` stored under that key, or
  None. No lock.
* ``record(job_id, lease, name, occurrence, kind, result)``: insert the step at the
  next position of the job's history, with the job row locked and its lease checked
  in the same statement (``STEP_RECORD`` of ``db/durable.py``). A lease that is no
  longer current records nothing and raises ``RunFenced``: the run stops. Called
  inside ``transaction.atomic(using=...)``, the row lock holds the lease until that
  transaction ends, so what the transaction wrote commits only while the run owns
  the job.
* ``encode(value, where)``: a result's JSON text, checked like a job's return value
  (JSON round trip, ``PGJOBS["MAX_RESULT_BYTES"]``); ``TypeError`` naming ``where``.

``using``: the database alias of the jobs (default ``PGJOBS["DATABASE"]``).
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db.store import StepRow, step_record, step_recorded
from django_pgjobs.durable.control import RunFenced
from django_pgjobs.support.validation import check_json, json_bytes, json_text

#: The kinds of step a history holds.
KINDS = frozenset({"step", "atomic", "sleep", "patch", "signal", "event"})


def _connection(using: str | None) -> Any:
    return connections[using or get_settings().DATABASE]


def recorded(
    job_id: int, name: str, occurrence: int, *, using: str | None = None
) -> StepRow | None:
    """The step recorded under ``(job_id, name, occurrence)``, or None."""
    return step_recorded(_connection(using), job_id, name, occurrence)


def record(
    job_id: int,
    lease: int,
    name: str,
    occurrence: int,
    kind: str,
    result: Any,
    *,
    using: str | None = None,
    encoded: str | None = None,
) -> int:
    """Record a step under ``lease``; its position (``seq``) in the job's history.
    ``result``: a JSON value (checked with ``encode``), or pass its text as
    ``encoded``. Raises ``RunFenced`` when the lease is no longer the job's, and
    ``ValueError`` when the key is recorded already (a run replaying a history it
    did not read)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(sorted(KINDS))}, got {kind!r}")
    text = encoded if encoded is not None else encode(result, f"step {name!r}")
    ours, seq = step_record(
        _connection(using),
        job_id=job_id,
        lease=lease,
        name=name,
        occurrence=occurrence,
        kind=kind,
        result=text,
    )
    if not ours:
        raise RunFenced(
            f"job {job_id}: lease {lease} is no longer current; step {name!r} was not "
            "recorded and the run stops"
        )
    if seq is None:
        raise ValueError(
            f"job {job_id}: step {name!r} (occurrence {occurrence}) is recorded already"
        )
    return int(seq)


def encode(value: Any, where: str) -> str | None:
    """The JSON text stored for a step's result (None for None); ``TypeError`` for a
    value that does not survive JSON or is larger than ``PGJOBS["MAX_RESULT_BYTES"]``."""
    if value is None:
        return None
    try:
        check_json(value, f"the result of {where}", exact_floats=False)
    except RecursionError:
        raise TypeError(f"the result of {where} is nested too deeply to store as JSON") from None
    text = json_text(value)
    limit = get_settings().MAX_RESULT_BYTES
    size = json_bytes(text)
    if size > limit:
        raise TypeError(
            f"the result of {where} is {size:,} bytes as JSON, more than "
            f"PGJOBS['MAX_RESULT_BYTES'] = {limit:,}; store large results elsewhere "
            "and return their key"
        )
    return text
