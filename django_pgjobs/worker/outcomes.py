"""The one module that writes a job's outcome to its row, then logs and signals it.

Every outcome write goes through here: the worker's completer (``write_batch``,
every completion of a batch in one statement), an ``@job(atomic=True)`` job's
completion inside its own transaction (``complete``), ``testing.run_jobs`` and the
Tasks bridge's ``task_finished`` (``after_write``). Each write is fenced by the
attempt's lease.

Signals and log lines follow the write, so nobody is told "succeeded" about a
write that was fenced off.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgjobs import signals
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.db.store import (
    Encoded,
    job_complete_chunk,
    job_complete_many,
    job_dead,
    job_park,
    job_release,
    job_retry,
    job_timed_out,
)
from django_pgjobs.durable.control import Parked

logger = logging.getLogger("django_pgjobs")

#: "released": handed back uncharged (an async run another job cancelled: running.py);
#: "waiting": a durable run parked (``extra["parked"]``: the ``Parked`` it raised)
Kind = Literal["completed", "retry", "dead", "fenced", "released", "waiting"]


@dataclass
class Outcome:
    """What should happen to the row (decided by ``executor``). ``written``: already
    written (an atomic job completes inside its own transaction)."""

    kind: Kind
    value: Any = None
    error: dict[str, Any] | None = None
    delay: float = 0.0
    exception: BaseException | None = None
    written: bool = False
    #: the JSON text of ``value``, made in the job thread (None: no value to store)
    encoded: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def log_extra(claimed: Claimed, worker: str | None) -> dict[str, Any]:
    return {
        "job_id": claimed.id,
        "task": claimed.task,
        "attempt": claimed.attempt,
        "worker": worker,
    }


#: Callbacks waiting for the outcome of one attempt, keyed by (job id, lease):
#: ``after_write`` registers one (the Tasks bridge, for ``task_finished``) and
#: ``report`` calls it once the fenced write has been decided.
_after_write: dict[tuple[int, int], Callable[[Outcome, bool], None]] = {}
_after_write_lock = threading.Lock()


def after_write(job_id: int, lease: int, callback: Callable[[Outcome, bool], None]) -> None:
    """Call ``callback(outcome, ours)`` when the outcome of attempt ``lease`` of job
    ``job_id`` has been written (``ours``) or fenced off (not ours)."""
    with _after_write_lock:
        _after_write[(job_id, lease)] = callback


def complete(connection: BaseDatabaseWrapper, claimed: Claimed, value: Any) -> bool:
    """Mark ``claimed`` completed with ``value``; True when the row was still ours.
    Also called inside an atomic job's own transaction, so the completion commits
    (or rolls back) with what the handler wrote. A job that ran in a chunk records
    its chunk run (``JOB_COMPLETE_CHUNK``)."""
    if claimed.chunk_run is not None:
        return bool(
            job_complete_chunk(connection, [(claimed.id, claimed.lease, value, claimed.chunk_run)])
        )
    return bool(job_complete_many(connection, [(claimed.id, claimed.lease, value)]))


def write(connection: BaseDatabaseWrapper, claimed: Claimed, outcome: Outcome) -> bool:
    """Apply one outcome; True when the row was still ours."""
    if outcome.written or outcome.kind == "fenced":
        return outcome.kind != "fenced"
    if outcome.kind == "completed":
        return complete(connection, claimed, stored(outcome))
    if outcome.kind == "released":
        # The statement of a release at shutdown: the run has ended, no slot is held.
        return job_release(connection, id=claimed.id, lease=claimed.lease)
    if outcome.kind == "waiting":
        return park(connection, claimed, outcome.extra["parked"])
    if outcome.error is None:
        raise ValueError(f"a {outcome.kind} outcome without an error entry")
    error = outcome.error
    if claimed.chunk_run is not None:
        # the attempt's entry names its chunk run; the write records it on the row too
        error = {**error, "chunk_run": claimed.chunk_run}
    if outcome.extra.get("timed_out"):
        status = job_timed_out(
            connection,
            id=claimed.id,
            lease=claimed.lease,
            retry=outcome.kind == "retry",
            delay=outcome.delay,
            error=error,
            suspect=claimed.suspect,  # a suspect given up on has not proved it ends well
        )
        if status == "dead" and outcome.kind == "retry":
            outcome.kind = "dead"  # attempts used up meanwhile (the statement decides)
        return status is not None
    if outcome.kind == "retry":
        status = job_retry(
            connection,
            id=claimed.id,
            lease=claimed.lease,
            delay=outcome.delay,
            error=error,
            suspect=bool(outcome.extra.get("suspect")),  # it killed its process: isolated.py
        )
        if status == "dead":
            outcome.kind = "dead"  # the attempts guard dead-lettered it: report that
        return status is not None
    return job_dead(connection, id=claimed.id, lease=claimed.lease, error=error)


def park(connection: BaseDatabaseWrapper, claimed: Claimed, parked: Parked) -> bool:
    """Park a durable run (JOB_PARK): waiting until ``parked.until``, or pending at once
    if it was woken since its last look; the attempt not counted. True when ours."""
    status = job_park(
        connection,
        id=claimed.id,
        lease=claimed.lease,
        until=parked.until,
        waiting_for=json.dumps(parked.waiting_for),
        seen=parked.seen_wakes,
        signal=parked.waiting_for.get("kind") == "signal",
    )
    return status is not None


def write_batch(
    connection: BaseDatabaseWrapper,
    items: Sequence[tuple[Claimed, Outcome]],
    *,
    redo: bool = True,
) -> Iterator[tuple[int, bool]]:
    """Write the outcomes of ``items``: every completion in ONE statement, the rest one
    by one. Yields ``(index in items, ours)`` as each write is decided, so a caller
    whose connection fails midway knows which ones are done (the statements
    recognise their own committed writes, so redoing the rest is safe).
    ``redo=False``: the first try of these items, so the completion need not look
    for an earlier committed run of itself (``JOB_COMPLETE_MANY``)."""
    to_complete = [
        i
        for i, (_, outcome) in enumerate(items)
        if outcome.kind == "completed" and not outcome.written
    ]
    # A chunk's jobs record their chunk run: a statement of their own, so the plain
    # completion stays the hot one.
    plain = [i for i in to_complete if items[i][0].chunk_run is None]
    chunked = [i for i in to_complete if items[i][0].chunk_run is not None]
    ours: set[int] = set()
    if plain:
        ours = job_complete_many(
            connection,
            [(items[i][0].id, items[i][0].lease, stored(items[i][1])) for i in plain],
            redo=redo,
        )
    if chunked:
        ours |= job_complete_chunk(
            connection,
            [
                (items[i][0].id, items[i][0].lease, stored(items[i][1]), str(items[i][0].chunk_run))
                for i in chunked
            ],
        )
    batched = set(to_complete)
    for i, (claimed, outcome) in enumerate(items):
        yield i, (claimed.id in ours if i in batched else write(connection, claimed, outcome))


def stored(outcome: Outcome) -> Any:
    """The value to store for a completion: the job thread's encoding when it made one."""
    return outcome.value if outcome.encoded is None else Encoded(outcome.encoded)


def report_fenced(
    claimed: Claimed, write: str, *, worker: str | None, consequence: str = ""
) -> None:
    """A write about ``claimed`` matched no row because its lease moved on: warn and
    send ``job_fenced``. Every fenced write (complete, retry, dead, release,
    heartbeat) is reported here, the same way."""
    logger.warning(
        "job %s (%s, attempt %s): lease %s lost; the %s write changed nothing "
        "(the job was reclaimed, cancelled or retried elsewhere)%s",
        claimed.id,
        claimed.task,
        claimed.attempt,
        claimed.lease,
        write,
        consequence,
        extra=log_extra(claimed, worker),
    )
    args = signal_args(claimed, worker)
    del args["attempt"]  # job_fenced says all the others do but the attempt (signals.py)
    signals.send(signals.job_fenced, **args, write=write)


def signal_args(claimed: Claimed, worker: str | None) -> dict[str, Any]:
    """What every job signal says about the job (``job_fenced``: all but the attempt):
    the one place these are spelled out."""
    return {
        "job_id": claimed.id,
        "task": claimed.task,
        "queue": claimed.queue,
        "attempt": claimed.attempt,
        "lease": claimed.lease,
        "worker": worker,
    }


def report(claimed: Claimed, outcome: Outcome, *, ours: bool, worker: str | None) -> None:
    """Log and signal what happened; never raises."""
    if (
        ours
        and outcome.kind == "completed"
        and not _after_write
        and not signals.job_succeeded.receivers
        and not outcome.extra
        and not logger.isEnabledFor(logging.DEBUG)
    ):
        # The hot path (a drain's every job): nothing to log, signal or call back, so
        # none of the dicts below is built. ``_after_write`` is read without its lock:
        # a callback is registered before the write it waits for is even queued.
        return
    base = signal_args(claimed, worker)
    extra = log_extra(claimed, worker)
    with _after_write_lock:
        callback = _after_write.pop((claimed.id, claimed.lease), None)
    if callback is not None:
        try:
            callback(outcome, ours)
        except Exception:  # report() never raises
            logger.exception("job %s: after-write callback failed", claimed.id, extra=extra)
    if not ours:
        write = {
            "completed": "complete",
            "fenced": "complete",
            "released": "release",
            "waiting": "park",
        }.get(outcome.kind, outcome.kind)
        report_fenced(claimed, write, worker=worker)
        return
    if outcome.kind == "released":
        logger.warning(
            "job %s (%s): its task on the event loop was cancelled by %s, not by the "
            "worker; given back, attempt not counted",
            claimed.id,
            claimed.task,
            outcome.extra.get("cancelled_by") or "a caller outside any job",
            extra=extra,
        )
        signals.send(signals.job_released, **base)
        return
    if outcome.kind == "waiting":
        parked = outcome.extra["parked"]
        logger.debug("job %s (%s) %s", claimed.id, claimed.task, parked, extra=extra)
        signals.send(signals.job_parked, until=parked.until, waiting_for=parked.waiting_for, **base)
        return
    if outcome.kind == "completed":
        logger.debug("job %s (%s) completed", claimed.id, claimed.task, extra=extra)
        signals.send(signals.job_succeeded, result=outcome.value, **base)
    elif outcome.kind == "retry":
        logger.info(
            "job %s (%s, attempt %s/%s) failed: %s; retrying in %.2fs",
            claimed.id,
            claimed.task,
            claimed.attempt,
            claimed.max_attempts,
            _describe(outcome),
            outcome.delay,
            extra=extra,
        )
        signals.send(
            signals.job_failed, exception=outcome.exception, retry_in=outcome.delay, **base
        )
    if outcome.extra.get("timed_out"):
        signals.send(
            signals.job_timed_out,
            retry_in=outcome.delay if outcome.kind == "retry" else None,
            **base,
        )
    if outcome.kind == "dead":
        logger.error(
            "job %s (%s, attempt %s/%s) dead-lettered: %s",
            claimed.id,
            claimed.task,
            claimed.attempt,
            claimed.max_attempts,
            _describe(outcome),
            extra=extra,
        )
        signals.send(signals.job_dead, exception=outcome.exception, **base)


def _describe(outcome: Outcome) -> str:
    err = outcome.error or {}
    return f"{err.get('type', '?')}: {err.get('message', '')}"
