"""The completer: writes the outcomes of finished runs, on a thread and a connection
of its own, so the claim loop and the job threads never wait for a write.

Outcomes arrive one by one (``put``) and are written in batches: whatever is queued
when the completer looks (up to ``BATCH_BYTES`` of results) goes into one statement
for the completions (``outcomes.write_batch``), retries and dead letters beside it.
Every outcome is written and reported exactly once, whatever goes wrong:

* a connection error: back off and repeat the rest. The repeat uses the statements'
  redo form, which recognises a write of the same lease that committed before its
  reply was lost; the first try of a batch uses the plain form (it cannot meet a
  committed run of itself, and it is the cheaper statement);
* any other error: write the batch one row at a time, so the row that causes it fails
  alone, dead-lettered with that error (``_write_failed``); a row that cannot even be
  dead-lettered is left to the reaper, and the worker exits 1.

A job leaves the in-flight table (and the heartbeat) once its outcome is written.

It also gives back the limit slots the database holds for runs written off while
their thread went on (``db/held_slots.py``): a run that timed out, or whose write was
fenced (cancelled, reclaimed). The slot goes back once both are known: the row was
written off (the timed-out write, or a fenced write, reported here) and the run has
really ended (``run_over``, from the job runner). Both facts are recorded on the
completer's thread alone, so exactly one of them finds the other and the slot is
given back once, after the write-off committed.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from django_pgjobs.db.store import held_slot_free
from django_pgjobs.support.error_entries import error_entry
from django_pgjobs.support.throttle import Backoff
from django_pgjobs.worker import outcomes
from django_pgjobs.worker.failure_kinds import CONNECTION_ERRORS
from django_pgjobs.worker.inflight import InFlight, InFlightTable
from django_pgjobs.worker.outcomes import Outcome

logger = logging.getLogger("django_pgjobs")

Item = tuple[InFlight, Outcome]
#: an outcome, or ``(entry, None)``: the run given up on has really ended
Queued = tuple[InFlight, Outcome | None]
#: A batch stops growing once its results' JSON passes this many characters.
BATCH_BYTES = 8 * 1024 * 1024


@dataclass(kw_only=True, eq=False)
class Completer:
    """``put(entry, outcome)`` and ``run_over(entry)`` from any thread; ``run()``
    writes until ``close()``."""

    table: InFlightTable
    #: outcomes written, by kind (the worker's summary)
    counts: dict[str, int]
    #: an outcome was written or given up on (the claim loop)
    wake: Callable[[], None]
    worker_id: str
    alias: str
    _done: queue.SimpleQueue[Queued | None] = field(default_factory=queue.SimpleQueue, init=False)
    #: runs whose held limit slot is to be given back (the completer's thread only)
    _owed: list[InFlight] = field(default_factory=list, init=False)

    def put(self, entry: InFlight, outcome: Outcome) -> None:
        self.table.results_waiting(_size(outcome))
        self._done.put((entry, outcome))
        entry.handed = True  # after the put: a stopping worker waits for this (drain)

    def run_over(self, entry: InFlight) -> None:
        """A run given up on (timed out) has really ended: its thread returned."""
        self._done.put((entry, None))

    def close(self) -> None:
        """Write what was put so far, then let ``run()`` return."""
        self._done.put(None)

    def run(self) -> None:
        backoff = Backoff("completion connection")
        connection = connections[self.alias]
        closing = False
        try:
            while True:
                batch, closed = self._take(block=not closing)
                closing = closing or closed
                if not batch:
                    if closing:
                        break
                    continue
                try:
                    self.write_batch(connection, batch, backoff)
                except BaseException:  # the completer never dies
                    logger.exception(
                        "completer: unexpected error; %d outcomes are left to the reaper",
                        len(batch),
                    )
                    self._forget([entry for entry, outcome in batch if outcome is not None])
                finally:
                    self.table.results_waiting(-sum(_size(outcome) for _, outcome in batch))
                    self.wake()
        finally:
            connection.close()

    def _take(self, *, block: bool) -> tuple[list[Queued], bool]:
        """The next batch: what is queued (waiting for the first item if ``block``), up
        to ``BATCH_BYTES`` of results; and whether ``close()`` was seen. Large results
        go in several statements, so no one statement and its copies in the driver
        hold them all at once."""
        batch: list[Queued] = []
        size = 0
        closed = False
        while size < BATCH_BYTES:
            try:
                if block and not batch and not closed:
                    item = self._done.get()
                else:
                    item = self._done.get_nowait()
            except queue.Empty:
                break
            if item is None:
                closed = True
                continue
            batch.append(item)
            size += _size(item[1])
        return batch, closed

    def write_batch(self, connection: Any, batch: list[Queued], backoff: Backoff) -> None:
        """Write and report every outcome of ``batch`` exactly once. Connection errors:
        back off and retry the rest (the statements recognise their own committed
        writes). Any other error: fall back to one row at a time, so the row that
        causes it fails alone. Then give back the held slots now owed."""
        todo: list[Item] = []
        for entry, outcome in batch:
            if outcome is None:
                self._learned(entry, run_over=True)
            else:
                todo.append((entry, outcome))
        per_row = False
        redo = False  # the first try cannot meet a committed run of itself
        while todo:
            try:
                if per_row:
                    self._write_rows(connection, todo)
                else:
                    self._write_outcomes(connection, todo, redo=redo)
                backoff.succeeded()
            except CONNECTION_ERRORS as exc:
                # Keep the rest: a completion is never dropped on a DB blip.
                backoff.failed(exc)
                connection.close()
                time.sleep(backoff.delay())
            except BaseException as exc:  # a data error or a bad value
                if per_row:
                    raise
                logger.warning(
                    "writing a batch of %d outcomes failed (%s: %s); writing them one by one",
                    len(todo),
                    type(exc).__name__,
                    exc,
                )
                per_row = True
            redo = True
        self._give_back(connection, backoff)
        self.wake()

    def _write_outcomes(self, connection: Any, todo: list[Item], *, redo: bool = True) -> None:
        """Batched (``outcomes.write_batch``); removes and reports each as it is written."""
        items = list(todo)
        pairs = [(e.claimed, o) for e, o in items]
        for index, ok in outcomes.write_batch(connection, pairs, redo=redo):
            entry, outcome = items[index]
            todo.remove(items[index])
            self._reported(entry, outcome, ok, redo=redo)

    def _write_rows(self, connection: Any, todo: list[Item]) -> None:
        """One row at a time; a row whose write fails with a data error is
        dead-lettered with that error (or, failing that too, left to the reaper)."""
        for item in list(todo):
            entry, outcome = item
            ok: bool | None
            try:
                ok = outcomes.write(connection, entry.claimed, outcome)
            except CONNECTION_ERRORS:
                raise
            except BaseException as exc:  # noqa: BLE001
                outcome, ok = self._write_failed(connection, entry, outcome, exc)
            todo.remove(item)
            if ok is None:
                self._forget([entry])
            else:
                self._reported(entry, outcome, ok)

    def _write_failed(
        self, connection: Any, entry: InFlight, outcome: Outcome, exc: BaseException
    ) -> tuple[Outcome, bool | None]:
        claimed = entry.claimed
        logger.error(
            "job %s (%s): its %s outcome could not be written (%s: %s); dead-lettering it",
            claimed.id,
            claimed.task,
            outcome.kind,
            type(exc).__name__,
            exc,
            extra=outcomes.log_extra(claimed, self.worker_id),
        )
        failure = RuntimeError(
            f"the {outcome.kind} outcome of job {claimed.id} could not be written: "
            f"{type(exc).__name__}: {exc}"
        )
        dead = Outcome(
            "dead",
            error=error_entry(claimed.attempt, failure, self.worker_id),
            exception=failure,
        )
        # The same dead-letter with an error entry reduced to plain words, in case
        # something in the first one is what the database refuses.
        bare = Outcome(
            "dead",
            error=error_entry(
                claimed.attempt,
                RuntimeError("the outcome could not be written"),
                self.worker_id,
                with_traceback=False,
            ),
            exception=failure,
        )
        for attempt in (dead, bare):
            try:
                return dead, outcomes.write(connection, claimed, attempt)
            except CONNECTION_ERRORS:
                raise
            except BaseException as again:  # noqa: BLE001
                logger.error("job %s: dead-lettering failed too: %s", claimed.id, again)
        return dead, None

    def _reported(self, entry: InFlight, outcome: Outcome, ok: bool, *, redo: bool = True) -> None:
        claimed = entry.claimed
        if not ok and redo and outcome.kind == "released":
            # A give-back whose first try may have committed with its reply lost, and
            # the job claimed again since (its lease moved on): JOB_RELEASE cannot tell
            # that from a row taken by a cancel or the reaper. Not ours either way, and
            # nothing of ours was lost: no fence to report.
            logger.info(
                "job %s (%s): given back, or taken meanwhile; the write was redone after "
                "a connection error and the row has moved on",
                claimed.id,
                claimed.task,
                extra=outcomes.log_extra(claimed, self.worker_id),
            )
            self.table.remove(entry)
            self._learned(entry, written_off=True, run_over=True)
            return
        outcomes.report(claimed, outcome, ours=ok, worker=self.worker_id)
        if outcome.extra.get("timed_out") and ok:
            self.counts["timed_out"] += 1
        self.counts[outcome.kind if ok else "fenced"] += 1
        self.table.remove(entry)
        if outcome.extra.get("timed_out"):
            self._learned(entry, written_off=True)  # its thread may go on
        elif not ok:
            # Cancelled or reclaimed meanwhile; this outcome is the run's end.
            self._learned(entry, written_off=True, run_over=True)

    def _learned(
        self, entry: InFlight, *, written_off: bool = False, run_over: bool = False
    ) -> None:
        """Record what is known of a run's held slot; owe it once both are known."""
        done_before = entry.written_off and entry.run_over
        entry.written_off |= written_off
        entry.run_over |= run_over
        if entry.written_off and entry.run_over and not done_before:
            self._owed.append(entry)

    def _give_back(self, connection: Any, backoff: Backoff) -> None:
        """HELD_SLOT_FREE for the runs owed; repeated after a connection error (a
        repeated delete is harmless). Any other error: the slots stay held until
        this worker exits, or is gone (the reaper), and the claims are only stricter."""
        while self._owed:
            runs = [(e.claimed.id, e.claimed.lease) for e in self._owed]
            try:
                held_slot_free(connection, worker=self.worker_id, runs=runs)
                backoff.succeeded()
            except CONNECTION_ERRORS as exc:
                backoff.failed(exc)
                connection.close()
                time.sleep(backoff.delay())
                continue
            except BaseException as exc:  # noqa: BLE001 - the completer never dies
                logger.error(
                    "could not give back the limit slots of %d abandoned run(s) (%s: %s); "
                    "they are given back when this worker exits",
                    len(runs),
                    type(exc).__name__,
                    exc,
                )
            self._owed.clear()

    def _forget(self, entries: list[InFlight]) -> None:
        """Outcomes that cannot be written: the reaper reclaims their jobs after STALE_AFTER."""
        self.table.forget(entries)
        self.wake()


def _size(outcome: Outcome | None) -> int:
    """The characters of JSON an outcome's result adds to its batch."""
    return len(outcome.encoded or "") if outcome is not None else 0
