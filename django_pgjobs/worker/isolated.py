"""Suspects run alone: a job reclaimed from a lost worker (``Job.suspect``, set by the
reaper) may be what killed that worker, so it runs in a child process of its own
until one of its runs ends normally (a crash is charged to the crasher, never to its
neighbours: docs/explanation/guarantees.md).

The job thread that got the suspect starts ``python -c <CHILD>``, hands it the claim
(pickled, on stdin) and waits. The child sets Django up, runs the job with the same
``executor.execute`` as any run (so results, atomic jobs, idempotency keys and retry
rules are the same) and sends the ``Outcome`` back (pickled, on its own copy of
stdout; the job's prints go to stderr). The worker writes it through the completer
like any outcome, and keeps the job's heartbeat meanwhile.

If the child dies without an outcome (``os._exit``, a signal, the OOM killer), that
run is charged to the job: a ``JobCrashed`` failure ("the job killed its process
(exit 9)"), retried or dead-lettered like any failure, and the job stays a suspect.
When the worker gives up on the run (timeout, cancel, lost lease, shutdown: its
context turns cancelled) it kills the child, which Python cannot do to a thread. A
child whose worker has gone exits on its own.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from datetime import datetime
from typing import Any, BinaryIO

from django.db import connections
from django.utils import timezone

from django_pgjobs.claim.rows import Claimed
from django_pgjobs.exceptions import JobCrashed, LeaseLost
from django_pgjobs.jobs import registry
from django_pgjobs.support.error_entries import error_entry, exception_type, storable
from django_pgjobs.worker import executor, outcomes
from django_pgjobs.worker.inflight import InFlight
from django_pgjobs.worker.outcomes import Outcome

logger = logging.getLogger("django_pgjobs")

#: How often the waiting job thread looks at the run's context (seconds).
POLL = 0.1

#: What the child runs: Django first, then this module (whose imports need the app
#: registry), so it is started with ``-c`` and not ``-m``.
CHILD = "import django; django.setup(); from django_pgjobs.worker import isolated; isolated.child()"

#: The environment variable naming the child's end of its lifeline (a pipe's fd).
LIFELINE_ENV = "PGJOBS_ISOLATED_LIFELINE"

#: The child's outcome, when the child itself failed before it could run the job
#: (Django setup, the claim's unpickling): an error text instead of an Outcome.
_SETUP_FAILED = "setup-failed"


def run(entry: InFlight, *, worker: str, alias: str) -> Outcome:
    """Run the suspect ``entry`` alone in a child process and wait for its outcome;
    never raises. Called on a job thread in place of ``executor.execute``."""
    claimed = entry.claimed
    started_at = timezone.now()
    # The lifeline: the child exits when it reads EOF on it, which happens once the
    # worker's end is closed: the run is over, or the worker died or exec'd itself
    # (a restart) -- the worker's end is close-on-exec.
    lifeline, keep = os.pipe()
    try:
        child = subprocess.Popen(  # noqa: S603 - this same interpreter, our own code
            [sys.executable, "-c", CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_child_env() | {LIFELINE_ENV: str(lifeline)},
            pass_fds=(lifeline,),
            start_new_session=True,  # a Ctrl-C in the terminal is the worker's to handle
        )
    except BaseException as exc:  # noqa: BLE001 - cannot start: this attempt's failure
        os.close(keep)
        return _keep_suspect(executor.last_resort(claimed, exc, worker))
    finally:
        os.close(lifeline)
    logger.info(
        "job %s (%s, attempt %s/%s) was reclaimed from a lost worker: running it alone "
        "in process %s",
        claimed.id,
        claimed.task,
        claimed.attempt,
        claimed.max_attempts,
        child.pid,
        extra=outcomes.log_extra(claimed, worker),
    )
    try:
        data, stopped = _wait(child, pickle.dumps((claimed, worker, alias)), entry)
    finally:
        os.close(keep)
    if stopped:
        # The worker gave up on the run (timeout, release) or its lease moved on: the
        # row is not ours to write, whatever the child managed to say.
        return Outcome(
            "fenced",
            exception=LeaseLost(
                f"job {claimed.id}: its isolated run was stopped by the worker "
                "(timed out, cancelled, reclaimed or released)"
            ),
        )
    reported = _decode(data) if child.returncode == 0 else None
    if isinstance(reported, Outcome):
        return reported
    if isinstance(reported, str):  # the child could not run the job at all
        failed = RuntimeError(f"the isolated process could not run the job: {reported}")
        return _keep_suspect(executor.last_resort(claimed, failed, worker))
    return crashed(claimed, child.returncode, worker, started_at)


def crashed(
    claimed: Claimed, returncode: int, worker: str | None, started_at: datetime | None = None
) -> Outcome:
    """The outcome of an isolated run whose process died without reporting one: the
    run is charged (retried or dead-lettered like any failure) and the job stays a
    suspect (``extra["suspect"]``, read by ``outcomes.write``)."""
    exc = JobCrashed(
        f"the job killed its process ({describe_exit(returncode)}) while it ran alone "
        f"as a suspect; job {claimed.id} ({claimed.task}) is charged for this run"
    )
    logger.warning("job %s: %s", claimed.id, exc, extra=outcomes.log_extra(claimed, worker))
    entry = error_entry(claimed.attempt, exc, worker, started_at, with_traceback=False)
    return _keep_suspect(executor.retry_or_dead(registry.find(claimed.task), claimed, exc, entry))


def describe_exit(returncode: int) -> str:
    """``exit 9`` or ``SIGKILL``: how a child process ended."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    if returncode == 0:
        return "exit 0 without reporting an outcome"
    return f"exit {returncode}"


def _keep_suspect(outcome: Outcome) -> Outcome:
    outcome.extra["suspect"] = True
    return outcome


def _child_env() -> dict[str, str]:
    """The worker's environment (its DJANGO_SETTINGS_MODULE), and its import path, so
    the child finds the project's modules as the worker did (manage.py's directory,
    ``--pythonpath``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    return env


def _wait(child: subprocess.Popen[bytes], payload: bytes, entry: InFlight) -> tuple[bytes, bool]:
    """Hand ``payload`` to ``child`` and wait for it to end; kill it once the run's
    context turns cancelled. (what it wrote, whether the worker stopped it)."""
    stopped = False
    send: bytes | None = payload
    while True:
        try:
            data, _ = child.communicate(send, timeout=POLL)
            return data or b"", stopped
        except subprocess.TimeoutExpired:
            send = None  # handed over already; communicate() goes on from where it was
            if entry.context.is_cancelled() and not stopped:
                stopped = True
                child.kill()
        except BaseException:  # never leave a child behind
            child.kill()
            child.wait()
            raise


def _decode(data: bytes) -> Outcome | str | None:
    try:
        kind, value = pickle.loads(data)  # noqa: S301 - from our own child, on its pipe
    except Exception:  # noqa: BLE001 - nothing, or half of it: the child died writing
        return None
    if kind == _SETUP_FAILED and isinstance(value, str):
        return value
    return value if isinstance(value, Outcome) else None


# ---------------------------------------------------------------------- the child


def child() -> None:
    """The child's side (``CHILD``): read the claim, run it, send the outcome, exit."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the job's prints go to stderr; stdout is the outcome's
    _exit_with_worker(int(os.environ.pop(LIFELINE_ENV)))
    try:
        claimed, worker, alias = pickle.loads(sys.stdin.buffer.read())  # noqa: S301 - the worker's
    except BaseException:  # noqa: BLE001 - reported to the worker, which fails the attempt
        _send(out, (_SETUP_FAILED, storable(traceback.format_exc)[-2000:]))
        os._exit(0)
    outcome = executor.execute(claimed, worker=worker, alias=alias)
    connections.close_all()
    _send(out, ("outcome", _portable(outcome)))
    sys.stderr.flush()
    os._exit(0)  # threads the job left behind do not keep the child alive


def _send(out: BinaryIO, message: tuple[str, Any]) -> None:
    out.write(pickle.dumps(message))
    out.flush()


def _portable(outcome: Outcome) -> Outcome:
    """``outcome`` as it can cross to the worker: an exception or a value that does not
    pickle (its JSON text is in ``encoded`` already) is replaced by a plain one."""
    try:
        pickle.loads(pickle.dumps(outcome))  # noqa: S301 - our own bytes: does it round-trip?
        return outcome
    except Exception:  # noqa: BLE001
        exc = outcome.exception
        if exc is not None:
            name = exception_type(type(exc))
            outcome.exception = RuntimeError(f"{name}: {storable(lambda: str(exc))[:2000]}")
    try:
        pickle.dumps(outcome)
    except Exception:  # noqa: BLE001
        outcome.value = None
    return outcome


def _exit_with_worker(lifeline: int) -> None:
    """Exit once the worker lets go of the lifeline (its process ended, even by
    SIGKILL, or exec'd a fresh worker): the run is reclaimed or released, and must
    not go on unseen."""

    def watch() -> None:
        while os.read(lifeline, 1):
            pass
        os._exit(70)

    threading.Thread(target=watch, name="pgjobs-isolated-lifeline", daemon=True).start()
