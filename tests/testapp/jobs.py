"""Sample jobs the tests run (autodiscovered like a user's ``jobs`` module)."""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import connection

from django_pgjobs import JobContext, job
from tests.helpers import run_records


@job
def add(a: int, b: int) -> int:
    return a + b


@job(queue="emails", priority=5, max_attempts=3)
def send_email(to: str, subject: str = "hi") -> dict[str, str]:
    return {"to": to, "subject": subject}


@job
def noop() -> None:
    return None


@job(max_attempts=3)
def always_fails(message: str = "boom") -> None:
    raise ValueError(message)


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


@job(max_attempts=5, discard_on=(Permanent,))
def discard_me() -> None:
    raise Permanent("not worth retrying")


@job(max_attempts=5, retry_on=(Transient,))
def retry_only_transient(kind: str) -> None:
    raise Transient("again") if kind == "transient" else RuntimeError("other")


@job(takes_context=True)
def whoami(context: JobContext) -> dict[str, Any]:
    return {
        "job_id": context.job_id,
        "attempt": context.attempt,
        "lease": context.lease,
        "key": context.idempotency_key,
    }


@job(max_attempts=3)
def flaky_until(marker: str, succeed_on: int) -> int:
    """Fails until it has run ``succeed_on`` times (counted in a file)."""
    with open(marker, "a") as fh:
        fh.write("x")
    with open(marker) as fh:
        runs = len(fh.read())
    if runs < succeed_on:
        raise RuntimeError(f"run {runs} fails")
    return runs


@job(max_attempts=5)
def sleep_then_mark(seconds: float, marker: str) -> str:
    """Sleeps, then appends its pid to ``marker``: counts executions across processes."""
    time.sleep(seconds)
    with open(marker, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    return "slept"


@job(max_attempts=5, atomic=True, takes_context=True)
def atomic_insert(context: JobContext, table: str, seconds: float) -> int:
    """Writes a row, sleeps, then (inside the same transaction) completes."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (job_id, lease) VALUES (%s, %s)", [context.job_id, context.lease]
        )
    time.sleep(seconds)
    return context.lease


@job(max_attempts=1)
def returns_set() -> Any:
    return {1, 2}


@job(max_attempts=1)
def spins(seconds: float) -> int:
    """A CPU-bound pure-Python loop (holds the GIL between switches)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


# --- worker/reaper tests (test_worker_*.py, test_process.py) -----------------------


@job(max_attempts=5, takes_context=True)
def record_run(context: JobContext, table: str, seconds: float = 0.0, started: str = "") -> int:
    """Appends (job id, lease, pid) to ``table`` (no unique key: duplicates stay visible).
    ``started``: a file created when the run begins (a claimed job may still wait for
    its thread; the row says running from the claim on)."""
    if started:
        with open(started, "a"):
            pass
    if seconds:
        time.sleep(seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (job_id, lease, pid) VALUES (%s, %s, %s)",
            [context.job_id, context.lease, os.getpid()],
        )
    return context.job_id


@job(max_attempts=5, takes_context=True)
def holds_gil(context: JobContext, key: str, seconds: float) -> float:
    """One C call holding the GIL for about ``seconds``, its run recorded (tests/helpers/run_records.py)."""
    return run_records.recorded_gil(context, key, seconds)


@job(max_attempts=5)
async def holds_gil_async(seconds: float) -> float:
    """Blocks the worker's event loop, GIL held, in one C call of ``seconds`` or more."""
    return run_records.hold_gil(seconds)


@job(max_attempts=1, takes_context=True)
def wait_for_cancel(context: JobContext, timeout: float) -> bool:
    """Runs until the worker marks its context cancelled (lease lost) or ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if context.is_cancelled():
            return True
        time.sleep(0.02)
    return False


@job(max_attempts=1)
def report_transactions() -> dict[str, Any]:
    """What a running job sees: is a transaction open here or on any other connection?"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state LIKE 'idle in transaction%%'"
        )
        idle_in_tx = cursor.fetchone()[0]
    return {
        "in_atomic_block": connection.in_atomic_block,
        "idle_in_tx": idle_in_tx,
        "autocommit": connection.get_autocommit(),
    }


# ---------------------------------------------------------------------------
# Jobs of the fault suite (tests/faults). They record each run in the table
# ``fault_effects`` (created by tests/faults/conftest.py) so tests count
# executions from the database, and they coordinate with the test through files.
# ---------------------------------------------------------------------------

import json  # noqa: E402
import math  # noqa: E402
import signal as _signal  # noqa: E402
import sys  # noqa: E402

from django_pgjobs import signals as _pgjobs_signals  # noqa: E402


class FaultDiscard(Exception):
    """Raised by fault jobs that must go straight to dead (discard_on)."""


def _fault_effect(context: JobContext, phase: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fault_effects (job_id, lease, attempt, pid, phase) "
            "VALUES (%s, %s, %s, %s, %s)",
            [context.job_id, context.lease, context.attempt, os.getpid(), phase],
        )


def _fault_wait_go(directory: str, context: JobContext, timeout: float = 120) -> None:
    """Block until the test creates ``go-<job id>-<lease>`` in ``directory``."""
    path = os.path.join(directory, f"go-{context.job_id}-{context.lease}")
    open(os.path.join(directory, f"waiting-{context.job_id}-{context.lease}"), "w").close()
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def _fault_hold(
    seconds: float,
    spin: bool,
    context: JobContext | None = None,
    until_file: str = "",
    gil: bool = False,
) -> None:
    """Hold ``seconds`` (``context``: or until the run is cancelled; ``until_file``: or
    until that file exists; ``gil``: in one C call that keeps the GIL, so no other
    thread of the worker runs meanwhile, its heartbeat thread included)."""
    end = time.monotonic() + seconds
    if gil:
        # ctypes.PyDLL, unlike CDLL, keeps the GIL across the foreign call: glibc's
        # usleep then holds it for exactly that long (a regular expression that
        # backtracks, tests/helpers/run_records.py, is the real-world case but its length
        # is a guess on a loaded box).
        import ctypes

        ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))
    elif context is not None or until_file:
        while time.monotonic() < end:
            if context is not None and context.is_cancelled():
                return
            if until_file and os.path.exists(until_file):
                return
            time.sleep(0.05)
    elif spin:  # CPU-bound pure Python: holds the GIL between switch intervals
        n = 0
        while time.monotonic() < end:
            n += 1
    else:
        time.sleep(seconds)


@job(max_attempts=5, takes_context=True, discard_on=(FaultDiscard,))
def fault_step(
    context: JobContext,
    dir: str = "",
    hold: float = 0.0,
    spin: bool = False,
    stop_at: str = "",
    wait_go: bool = False,
    mode: str = "ok",
    until_cancelled: bool = False,
    until_file: str = "",
    gil: bool = False,
    pad: int = 0,
) -> int | str:
    """A job with a probe at every boundary.

    ``stop_at="claimed"`` SIGSTOPs the whole worker before the handler does
    anything; ``stop_at="end"`` after the handler's effects, before it returns
    (so before its completion is flushed). ``until_cancelled``: the hold ends early
    once the run is cancelled (its lease lost); ``until_file``: once that file exists
    (a wait that is not a guess at a loaded box's speed); ``gil``: the hold keeps the
    GIL (one C call: the worker's threads all stop). ``mode`` picks the outcome ("ok",
    "raise" or "discard"). Stops and failures happen on the first claim only (lease 1:
    a lost worker's attempt is given back, so ``attempt`` repeats after a reclaim).
    ``pad``: returns a string of that many characters instead of the lease (a result
    large enough that a workflow child reads it alone, as a stream of pieces).
    """
    first = context.lease == 1
    if stop_at == "claimed" and first:
        os.kill(os.getpid(), _signal.SIGSTOP)
    _fault_effect(context, "start")
    if wait_go:
        _fault_wait_go(dir, context)
    if hold:
        _fault_hold(hold, spin, context if until_cancelled else None, until_file, gil)
    _fault_effect(context, "end")
    if stop_at == "end" and first:
        os.kill(os.getpid(), _signal.SIGSTOP)
    if mode == "raise" and first:
        raise ValueError(f"fault_step failed on attempt {context.attempt}")
    if mode == "discard" and first:
        raise FaultDiscard("fault_step discarded")
    if pad:
        return f"{context.lease}:" + "x" * pad
    return context.lease


@job(max_attempts=5, atomic=True, takes_context=True)
def fault_atomic(
    context: JobContext, dir: str = "", stop_at: str = "", wait_go: bool = False
) -> int:
    """Atomic: its effect row commits with the completion, or not at all. A
    workflow callback reads its parents' results first, in its transaction."""
    list(context.parent_results.values())
    _fault_effect(context, "end")
    if wait_go:
        _fault_wait_go(dir, context)
    if stop_at == "end" and context.lease == 1:  # the first claim (see fault_step)
        os.kill(os.getpid(), _signal.SIGSTOP)
    return context.lease


@job(takes_context=True)
def fault_count(context: JobContext) -> None:
    """The contention job: record one execution and return."""
    _fault_effect(context, "end")


class FaultUnprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


class FaultSurrogate(Exception):
    """An exception class whose name jsonb cannot store as it is."""


FaultSurrogate.__qualname__ = "FaultSurrogate\ud800"


@job(max_attempts=2)
def fault_poison(kind: str) -> Any:
    """Every way a handler can misbehave."""
    if kind == "unprintable":
        raise FaultUnprintable
    if kind == "surrogate_type":
        raise FaultSurrogate("named \udc00 badly")
    if kind == "raise":
        raise ValueError("poison raised")
    if kind == "exit":
        sys.exit(3)
    if kind == "kbint":
        raise KeyboardInterrupt
    if kind == "set":
        return {1, 2}
    if kind == "nan":
        return math.nan
    if kind == "nul_error":
        raise ValueError("bad \x00 byte")
    if kind == "nul_return":
        return "a\x00b"
    if kind == "surrogate_return":
        return "\ud800"
    return "ok"


def _fault_signal_log(signal: Any, **kwargs: Any) -> None:
    path = os.environ.get("PGJOBS_FAULT_SIGNAL_LOG")
    if path:
        names = {id(v): k for k, v in vars(_pgjobs_signals).items()}
        record = {
            "signal": names.get(id(signal), "?"),
            "pid": os.getpid(),
            **{k: v for k, v in kwargs.items() if isinstance(v, int | str | None)},
        }
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")


def _fault_raising_receiver(**kwargs: Any) -> None:
    raise RuntimeError("a receiver that raises")


if os.environ.get("PGJOBS_FAULT_SIGNAL_LOG"):
    for _sig in (_pgjobs_signals.job_fenced, _pgjobs_signals.jobs_reaped):
        _sig.connect(_fault_signal_log, weak=False)
if os.environ.get("PGJOBS_FAULT_RAISING_RECEIVERS"):
    for _sig in (
        _pgjobs_signals.job_started,
        _pgjobs_signals.job_succeeded,
        _pgjobs_signals.job_failed,
        _pgjobs_signals.job_dead,
        _pgjobs_signals.job_fenced,
        _pgjobs_signals.jobs_reaped,
    ):
        _sig.connect(_fault_raising_receiver, weak=False)


@job
def fault_anything(*args: Any, **kwargs: Any) -> None:
    """Accepts any arguments: the bad-input property test enqueues generated values."""


@job(max_attempts=1, priority=-10)
def kills_its_process(seconds: float) -> None:
    """Takes the whole worker process down (as a segfault or an OOM kill would)."""
    time.sleep(seconds)
    os._exit(3)


@job(max_attempts=2)
def echo_value(*args: Any, **kwargs: Any) -> Any:
    """Returns what it was given (the size-bound and property tests send odd values)."""
    return {"args": list(args), "kwargs": kwargs}


# -- metrics and tracing (tests/*/test_metrics*.py, tests/*/test_tracing*.py)


@job(queue="traced", max_attempts=2)
def traced_fails_once(marker: str) -> str:
    """Fails on its first run, succeeds on the second (two spans of one trace)."""
    with open(marker, "a") as fh:
        fh.write("x")
    with open(marker) as fh:
        if len(fh.read()) < 2:
            raise RuntimeError("first run fails")
    return "ok"


@job(timeout=0.3, max_attempts=1)
def times_out(seconds: float) -> None:
    time.sleep(seconds)


# -- suspects run alone (tests/process/test_suspects.py)


@job(max_attempts=2)
def exits_nine(seconds: float) -> None:
    """Takes its process down with ``os._exit(9)`` after ``seconds``."""
    time.sleep(seconds)
    os._exit(9)


@job(max_attempts=1)
def leaves_transaction_open(table: str, n: int) -> int:
    """Writes ``n`` into ``table`` after a raw BEGIN and returns without COMMIT."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(f"INSERT INTO {table} (n) VALUES (%s)", [n])
    return n


@job(max_attempts=1)
def writes_n(table: str, n: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} (n) VALUES (%s)", [n])
    return n


@job(max_attempts=3, atomic=True, takes_context=True)
def loses_races(context: JobContext, table: str, races: int) -> int:
    """An atomic job whose transaction loses a real race on its first ``races`` runs:
    under REPEATABLE READ it reads ``{table}_counter``, another connection then updates
    that row and commits, and its own UPDATE fails with a serialization failure (40001).
    Each run is counted in ``{table}_runs`` from outside the transaction (kept when it
    rolls back); the job's write to ``table`` counts only when it commits."""
    import psycopg

    from django_pgjobs.support.pgconn import psycopg_params

    with psycopg.connect(**psycopg_params("default"), autocommit=True) as other:
        run = other.execute(
            f"INSERT INTO {table}_runs (job_id) VALUES (%s) RETURNING run", [context.job_id]
        ).fetchone()[0]  # type: ignore[index]
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute(f"SELECT n FROM {table}_counter WHERE id = 1")  # the snapshot
            if run <= races:
                other.execute(f"UPDATE {table}_counter SET n = n + 1 WHERE id = 1")
            cursor.execute(f"UPDATE {table}_counter SET n = n + 1 WHERE id = 1")
            cursor.execute(
                f"INSERT INTO {table} (job_id, lease) VALUES (%s, %s)",
                [context.job_id, context.lease],
            )
    return int(run)


from tests.testapp import core_jobs  # noqa: E402,F401  (registers the worker tests' jobs)
