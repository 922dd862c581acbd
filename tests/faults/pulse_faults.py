"""Statement-level faults in the heartbeat process (``django_pgjobs/pulse.py``).

Test-only code. The heartbeat process imports psycopg and no Django, so the
injector's execute wrapper (``tests/faults/injector.py``) cannot reach its
connection. Instead a worker under a plan (``$PGJOBS_FAULT_PLAN``) starts its
heartbeat process as ``python -m tests.faults.pulse_faults`` (the injector sets
``PulseLink.module`` at the worker's first connection): this module wraps
``Pulse.connect`` so that the process's connection goes through the same plan (its
path comes with the worker's environment), then runs ``django_pgjobs.pulse.main()``
unchanged. Production starts ``python -m django_pgjobs.pulse``, which has no hook.
A plan's ``down_while`` (a path) keeps the process from starting while that file
exists: the worker's supervisor meets a process that dies at once, again and again.

The process's two statements are named after the entries of the config the worker
hands it: ``pulse:JOB_HEARTBEAT_PULSE`` and ``pulse:WORKER_UPSERT`` (any other text:
``pulse:other <digest>``, which the matrix's coverage audit then reports). A fault
hits a beat for jobs in flight only: a beat for none (the worker's thread late at
start-up on a loaded box) is let through, so that the fault lands while a job holds
the GIL. The three modes as for the worker: ``raise`` fails before the server;
``ambiguous`` runs the statement (autocommit: it commits), closes the connection
and raises; ``terminate`` runs it in a transaction and has a second connection kill
the backend before the COMMIT (the server rolls it back).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_pgjobs import pulse
from tests.faults.injector import PLAN_ENV, SLEEP_MARK, Injector, _terminate_when_sleeping

if TYPE_CHECKING:  # psycopg is imported late, as the process itself does (pulse.main)
    import psycopg

#: Config entry of the statement -> its name in the plan, the logs and the matrix.
STATEMENTS = {"heartbeat": "pulse:JOB_HEARTBEAT_PULSE", "worker_upsert": "pulse:WORKER_UPSERT"}


def statement_name(config: dict[str, Any], query: Any) -> str:
    text = str(query)
    for key, name in STATEMENTS.items():
        if text == config.get(key):
            return name
    return "pulse:other " + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:8]


def _fault(message: str) -> psycopg.OperationalError:
    import psycopg

    return psycopg.OperationalError(f"pgjobs fault injection (heartbeat process): {message}")


class FaultyConnection:
    """The heartbeat process's connection with the plan on ``execute`` (what the
    process calls; ``close`` passes through)."""

    def __init__(self, conn: psycopg.Connection[Any], owner: pulse.Pulse, injector: Injector):
        self.conn = conn
        self.owner = owner
        self.injector = injector

    def close(self) -> None:
        self.conn.close()

    def execute(self, query: Any, params: Any = None) -> Any:
        injector = self.injector
        name = statement_name(self.owner.config, query)
        injector._append("log", name)
        if injector.plan.get("texts"):
            injector._append("texts", json.dumps([name, str(query)]))
        with self.owner.lock:
            in_flight = bool(self.owner.leases)
        if not in_flight or not injector._should_fire(name, str(query)):
            return self.conn.execute(query, params)
        pid = self.conn.info.backend_pid
        injector._record_fired(name, backend_pid=pid)
        if injector.mode == "raise":
            raise _fault("the statement failed before reaching the server")
        if injector.mode == "ambiguous":
            self.conn.execute(query, params)  # autocommit: committed now
            time.sleep(float(injector.plan.get("linger", 0)))
            self.conn.close()
            raise _fault("server closed the connection before the reply (it may have committed)")
        self.conn.execute("BEGIN")
        self.conn.execute(query, params)
        killer = threading.Thread(
            target=_terminate_when_sleeping,
            args=(self.owner.config["connection"], pid),
            daemon=True,
        )
        killer.start()
        import psycopg

        try:
            self.conn.execute(f"SELECT pg_sleep(30) /* {SLEEP_MARK} */")
        except psycopg.Error as exc:
            raise _fault(f"backend terminated mid-transaction: {exc}") from exc
        finally:
            killer.join(timeout=10)
        raise AssertionError("pg_terminate_backend did not end the session")


def faulty_connect(injector: Injector, original: Callable[[pulse.Pulse], Any]) -> Any:
    """A ``Pulse.connect`` whose connection goes through ``injector``."""

    def connect(self: pulse.Pulse) -> Any:
        if self.conn is None:
            self.conn = FaultyConnection(original(self), self, injector)
        return self.conn

    return connect


def install() -> Injector | None:
    """Wrap the process's connection in the plan of ``$PGJOBS_FAULT_PLAN`` (no-op
    without one)."""
    path = os.environ.get(PLAN_ENV)
    if not path:
        return None
    with open(path) as fh:
        injector = Injector(json.load(fh))
    connect = faulty_connect(injector, pulse.Pulse.connect)
    pulse.Pulse.connect = connect  # type: ignore[method-assign]
    return injector


def down(injector: Injector | None) -> bool:
    """The plan's ``down_while`` file exists: this process exits at once (status 3),
    before reading its config, as one that cannot start (its worker runs degraded and
    tries again with backoff until the file is gone)."""
    marker = injector.plan.get("down_while") if injector is not None else None
    return bool(marker) and os.path.exists(marker)


if __name__ == "__main__":
    if down(install()):
        sys.exit(3)
    sys.exit(pulse.main())
