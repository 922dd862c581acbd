"""Statement-level fault injection through Django's ``connection.execute_wrapper``.

Test-only code: ``tests/settings.py`` calls :func:`install` when the environment
variable ``PGJOBS_FAULT_PLAN`` names a JSON plan file, so a ``runjobs`` subprocess
(or the driver, ``tests/faults/driver.py``) wraps every database call of every
thread. Production code has no hook: the test process patches Django's PostgreSQL
``DatabaseWrapper`` so each connection object carries the wrapper from birth.

A plan (JSON object):

``statement``  name of the statement to fault (see :func:`statement_name`), a
               pattern of names (``"orm:UPDATE queue*"``, :func:`fnmatch.fnmatchcase`),
               or ``"*read"``: every read-only statement; absent: log only;
``mode``       ``raise``: fail before reaching the server; ``ambiguous``: run it
               (it commits in autocommit), then close the connection and raise, so
               the client cannot tell; ``terminate``: run it inside a transaction,
               then ``pg_terminate_backend`` the session from a second connection
               while it sleeps, before COMMIT (the server rolls it back);
``skip``       matching calls to let through first (default 0);
``times``      how many calls to fault (default 1; 0 = all);
``until``      a file: fault every matching call until it exists (a window of
               failures, for the LISTEN connection: ``times`` is then ignored);
``linger``     ambiguous only: seconds between the commit and the error (a slow
               connection loss: other threads carry on meanwhile);
``at_commit``  ambiguous only, for a statement inside a transaction: let it and the
               rest of the transaction run, then lose the reply to its ``COMMIT``
               (which committed) instead of dropping the connection mid-transaction;
``fired``      file to append one line to per injected fault;
``log``        file to append every statement's name to (coverage capture);
``texts``      file to append ``[name, text]`` of every statement to;
``signals``    file to append job_succeeded/failed/dead/fenced signals to.

Three paths do not go through ``execute``: ``enqueue_many``'s ``COPY`` runs through the
connection's ``execute_wrappers`` by itself (``job_insert.job_copy``), so it is seen
here as ``copy:job``; the worker's LISTEN connection is a plain psycopg connection of
the class ``Listener.connection_class``, which the injector replaces (at the first
Django connection) with a subclass that goes through it: ``listener:LISTEN``,
``listener:wait`` (the notifies loop) and ``listener:keep-alive``; the worker's
heartbeat process (``django_pgjobs/pulse.py``, psycopg only) is started as
``tests.faults.pulse_faults``, which puts the same plan on its connection:
``pulse:JOB_HEARTBEAT_PULSE`` and ``pulse:WORKER_UPSERT``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

PLAN_ENV = "PGJOBS_FAULT_PLAN"
SLEEP_MARK = "pgjobs-fault-sleep"
MODES = ("raise", "ambiguous", "terminate")

_WS = re.compile(r"\s+")
_IN_LIST = re.compile(r"IN \((?:%s, )*%s\)")
_TABLE = re.compile(r'"?(django_pgjobs_\w+)"?')
_WRITE = re.compile(
    r"\b(INSERT|UPDATE|DELETE|FOR UPDATE|FOR NO KEY UPDATE|pg_notify|COPY)\b", re.IGNORECASE
)


def _normal(text: str) -> str:
    return _WS.sub(" ", text).strip()


def db_constants() -> dict[str, str]:
    """The SQL statements of ``django_pgjobs.db`` and ``django_pgjobs.claim`` (every
    module's constants) and the compiled claims (``claim.claim_statements``), each
    named after its package: ``db.NAME`` or ``claim.NAME`` -> text. The LISTEN
    connection's statements are named apart (``listener:...``)."""
    import importlib
    import pkgutil

    from django_pgjobs import claim, db

    out: dict[str, str] = {}
    for package in (db, claim):
        prefix = package.__name__.rsplit(".", 1)[1]
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            for name, value in vars(importlib.import_module(info.name)).items():
                if (
                    name.isupper()
                    and not name.startswith(("_", "LISTEN"))
                    and isinstance(value, str)
                    and re.match(
                        r"\s*(SELECT|WITH|INSERT|UPDATE|DELETE|CREATE|DROP|ANALYZE)\b", value
                    )
                ):
                    # a constant imported from its home module is the same text
                    named = f"{prefix}.{name}"
                    assert out.get(named, value) == value, f"two statements are named {named}"
                    out[named] = value
    # The claims are compiled from Job.objects.claimable on first use, not module text.
    out.update({f"claim.{n}": t for n, t in claim.claim_statements().items()})
    return out


_PATTERNS: list[tuple[str, re.Pattern[str]]] | None = None


def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    global _PATTERNS
    if _PATTERNS is None:
        pats = []
        named = db_constants()
        for name, text in named.items():
            # JOB_BY_KEY and JOB_BY_UNIQUE_KEY are formatted with the model's columns.
            body = re.escape(_normal(text)).replace(r"\{columns\}", ".+?")
            body = body.replace(r"\{\{columns\}\}", ".+?")
            pats.append((name, re.compile(body + r"\Z", re.DOTALL)))
        _PATTERNS = pats
    return _PATTERNS


def statement_name(sql_text: str) -> str:
    """``db.JOB_RETRY``-style name for a statement of ``django_pgjobs.db`` or
    ``django_pgjobs.claim`` (its package and the constant's name); ``orm:...`` for an ORM statement on a pgjobs table (a stable
    digest of its shape); ``other:...``."""
    text = _normal(sql_text)
    for name, pattern in _patterns():
        if pattern.match(text):
            return name
    tables = sorted(set(_TABLE.findall(text)))
    if text.upper().startswith("COPY ") and tables:
        # enqueue_many's bulk insert: one statement whatever its column list.
        return "copy:" + "+".join(t.removeprefix("django_pgjobs_") for t in tables)
    shape = _IN_LIST.sub("IN (%s...)", text)
    digest = hashlib.sha1(shape.encode(), usedforsecurity=False).hexdigest()[:8]
    verb = text.split(" ", 1)[0].upper()
    if tables:
        short = "+".join(t.removeprefix("django_pgjobs_") for t in tables)
        return f"orm:{verb} {short} {digest}"
    return f"other:{verb} {digest}"


def is_read_only(sql_text: str) -> bool:
    return re.match(
        r"(SELECT|WITH)\b", _normal(sql_text).upper()
    ) is not None and not _WRITE.search(sql_text)


class Injector:
    """The execute wrapper: logs statements, injects the planned fault."""

    def __init__(self, plan: dict[str, Any]):
        self.plan = plan
        self.target: str | None = plan.get("statement")
        self.mode: str = plan.get("mode", "raise")
        if self.target and self.mode not in MODES:
            raise ValueError(f"plan mode must be one of {MODES}, got {self.mode!r}")
        self.skip = int(plan.get("skip", 0))
        self.times = int(plan.get("times", 1))
        self.seen = 0
        self.fired = 0
        self.lock = threading.Lock()
        self.local = threading.local()

    def _append(self, key: str, line: str) -> None:
        path = self.plan.get(key)
        if path:
            with open(path, "a") as fh:
                fh.write(line + "\n")

    def _should_fire(self, name: str, sql_text: str) -> bool:
        if not self.target or getattr(self.local, "busy", False):
            return False
        if self.target == "*read":
            hit = is_read_only(sql_text) and not name.startswith("other:")
        else:
            hit = fnmatch.fnmatchcase(name, self.target)
        if not hit:
            return False
        until = self.plan.get("until")
        with self.lock:
            self.seen += 1
            if self.seen <= self.skip:
                return False
            if until:
                if os.path.exists(until):
                    return False
            elif self.times and self.fired >= self.times:
                return False
            self.fired += 1
            return True

    def _record_fired(self, name: str, **extra: Any) -> None:
        self._append(
            "fired",
            json.dumps(
                {
                    "statement": name,
                    "mode": self.mode,
                    "pid": os.getpid(),
                    "thread": threading.current_thread().name,
                    "at": time.time(),
                    **extra,
                }
            ),
        )

    def __call__(
        self,
        execute: Callable[..., Any],
        sql_text: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        name = statement_name(sql_text)
        self._append("log", name)
        if self.plan.get("texts"):
            self._append("texts", json.dumps([name, sql_text]))
        if not self._should_fire(name, sql_text):
            return execute(sql_text, params, many, context)
        self._record_fired(name)
        return getattr(self, f"_{self.mode}")(execute, sql_text, params, many, context)

    # -- the three faults -------------------------------------------------------

    @staticmethod
    def _raise(
        execute: Callable[..., Any], sql_text: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        from django.db import OperationalError

        raise OperationalError(
            "pgjobs fault injection: the statement failed before reaching the server"
        )

    def _ambiguous(
        self,
        execute: Callable[..., Any],
        sql_text: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        db = context["connection"]
        if self.plan.get("at_commit") and not db.get_autocommit():
            # Inside a transaction: the rest of it runs and its COMMIT lands; the reply
            # to the COMMIT is lost (see _patch_wrapper_class).
            result = execute(sql_text, params, many, context)
            db._pgjobs_lose_commit_reply = True
            return result
        execute(sql_text, params, many, context)  # in autocommit: committed now
        _lose_reply(db, self.plan, "the reply (the statement may have committed)")

    def _terminate(
        self,
        execute: Callable[..., Any],
        sql_text: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        import psycopg
        from django.db import OperationalError

        db = context["connection"]
        raw = db.connection
        pid = raw.info.backend_pid
        self.local.busy = True
        try:
            if raw.autocommit:
                raw.execute("BEGIN")
            execute(sql_text, params, many, context)
            params_ = db.get_connection_params()
            for key in ("cursor_factory", "context", "server_side_binding"):
                params_.pop(key, None)
            killer = threading.Thread(
                target=_terminate_when_sleeping, args=(params_, pid), daemon=True
            )
            killer.start()
            try:
                raw.execute(f"SELECT pg_sleep(30) /* {SLEEP_MARK} */")
            except psycopg.Error as exc:
                db.errors_occurred = True
                raise OperationalError(
                    f"pgjobs fault injection: backend terminated mid-transaction: {exc}"
                ) from exc
            finally:
                killer.join(timeout=10)
            raise AssertionError("pg_terminate_backend did not end the session")
        finally:
            self.local.busy = False


def _terminate_when_sleeping(params: dict[str, Any], pid: int) -> None:
    import psycopg

    with psycopg.connect(**params, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid = %s AND query LIKE %s",
                [pid, f"%{SLEEP_MARK}%"],
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.01)


def _listener_name(query: Any) -> str:
    text = _normal(str(query)).upper()
    if text.startswith("LISTEN "):
        return "listener:LISTEN"
    if text == "SELECT 1":
        return "listener:keep-alive"
    return "listener:other " + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:8]


def _listen_fault(message: str) -> Exception:
    import psycopg

    return psycopg.OperationalError(f"pgjobs fault injection (LISTEN connection): {message}")


def _kill_backend(dsn: str, pid: int) -> None:
    """Terminate backend ``pid`` from a second connection, as an operator (or a
    failover) would; its client finds out on its next read."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])


def _make_listen_connection_class() -> type:
    import psycopg

    class ListenConnection(psycopg.Connection[Any]):
        """The worker's LISTEN connection with the injector on its three calls:
        ``LISTEN``, the notifies loop (``listener:wait``) and the keep-alive."""

        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            injector = _INJECTOR
            name = _listener_name(query)
            if injector is None:
                return super().execute(query, *args, **kwargs)
            injector._append("log", name)
            if injector.plan.get("texts"):
                injector._append("texts", json.dumps([name, str(query)]))
            if not injector._should_fire(name, str(query)):
                return super().execute(query, *args, **kwargs)
            injector._record_fired(name, backend_pid=self.info.backend_pid)
            if injector.mode == "raise":
                raise _listen_fault("the statement failed before reaching the server")
            result = super().execute(query, *args, **kwargs)
            if injector.mode == "ambiguous":
                self.close()
                raise _listen_fault("server closed the connection before the reply")
            _kill_backend(self.info.dsn, self.info.backend_pid)
            super().execute("SELECT 1")  # raises: the backend is gone
            del result
            raise AssertionError("pg_terminate_backend did not end the LISTEN session")

        def notifies(self, **kwargs: Any) -> Any:
            injector = _INJECTOR
            name = "listener:wait"
            if injector is None:
                yield from super().notifies(**kwargs)
                return
            injector._append("log", name)
            if injector.plan.get("texts"):
                injector._append("texts", json.dumps([name, "(wait for notifications)"]))
            if injector.mode in ("raise", "terminate") and injector._should_fire(name, ""):
                injector._record_fired(name, backend_pid=self.info.backend_pid)
                if injector.mode == "raise":
                    raise _listen_fault("the wait failed before reaching the server")
                # Killed while it waits: the wait itself must notice.
                args = (self.info.dsn, self.info.backend_pid)
                threading.Timer(0.2, _kill_backend, args=args).start()
                yield from super().notifies(**kwargs)
                return
            inner = super().notifies(**kwargs)
            for note in inner:
                if injector.mode == "ambiguous" and injector._should_fire(name, ""):
                    # The notification reached the client's socket; the client loses
                    # it with the connection.
                    injector._record_fired(
                        name, backend_pid=self.info.backend_pid, lost=note.payload
                    )
                    inner.close()
                    self.close()
                    raise _listen_fault(f"connection lost with notification {note.payload!r}")
                yield note

    return ListenConnection


_INJECTOR: Injector | None = None


def _lose_reply(db: Any, plan: dict[str, Any], what: str) -> NoReturn:
    """What the client sees when the server did the work but the connection drops
    before ``what`` arrives: after the plan's ``linger``, a closed connection and an
    OperationalError (Django then reconnects)."""
    from django.db import OperationalError

    time.sleep(float(plan.get("linger", 0)))
    db.errors_occurred = True
    with contextlib.suppress(Exception):  # the connection may be half broken already
        db.connection.close()
    raise OperationalError(f"pgjobs fault injection: server closed the connection before {what}")


def _patch_wrapper_class() -> None:
    """Every Django connection object gets the wrapper from birth, on every thread
    (``hot_cursor`` takes Django's ordinary cursor when wrappers are installed);
    its ``_commit`` loses the reply of a COMMIT an ``at_commit`` fault marked."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    original = DatabaseWrapper.__init__
    # (private methods of Django's base wrapper: setattr/getattr keep mypy quiet)
    original_commit = getattr(DatabaseWrapper, "_commit")  # noqa: B009
    original_rollback = getattr(DatabaseWrapper, "_rollback")  # noqa: B009

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.execute_wrappers.append(_INJECTOR)

    def _commit(self: Any) -> Any:
        lose, self._pgjobs_lose_commit_reply = (
            getattr(self, "_pgjobs_lose_commit_reply", False),
            False,
        )
        result = original_commit(self)
        if not lose:
            return result
        assert _INJECTOR is not None
        _lose_reply(self, _INJECTOR.plan, "the reply to COMMIT (the transaction committed)")

    def _rollback(self: Any) -> Any:
        self._pgjobs_lose_commit_reply = False
        return original_rollback(self)

    DatabaseWrapper.__init__ = __init__  # type: ignore[method-assign]
    setattr(DatabaseWrapper, "_commit", _commit)  # noqa: B010
    setattr(DatabaseWrapper, "_rollback", _rollback)  # noqa: B010


def _on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    _connect_signals()
    _patch_worker_connections()


_WORKER_DONE = False


def _patch_worker_connections() -> None:
    """The worker's LISTEN connection gets :class:`ListenConnection`, and its heartbeat
    process runs as ``tests.faults.pulse_faults`` (the same plan on its connection).
    Done at the first Django connection: the apps are loaded then, and a worker
    registers itself before its listener and its heartbeat process start."""
    global _WORKER_DONE
    if _WORKER_DONE:
        return
    _WORKER_DONE = True
    from django_pgjobs.worker.listener import Listener
    from django_pgjobs.worker.pulse_link import PulseLink

    Listener.connection_class = _make_listen_connection_class()
    PulseLink.module = "tests.faults.pulse_faults"


_SIGNALS_DONE = False


def _connect_signals() -> None:
    global _SIGNALS_DONE
    if _SIGNALS_DONE or _INJECTOR is None or not _INJECTOR.plan.get("signals"):
        return
    _SIGNALS_DONE = True
    from django_pgjobs import signals

    for name in ("job_succeeded", "job_failed", "job_dead", "job_fenced"):
        getattr(signals, name).connect(_make_logger(name), weak=False)
    try:
        from django.tasks.signals import task_finished
    except ImportError:  # Django < 6: no Tasks framework
        return
    task_finished.connect(_task_finished, weak=False)


def _task_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    assert _INJECTOR is not None
    _INJECTOR._append(
        "signals",
        json.dumps(
            {
                "signal": "task_finished",
                "pid": os.getpid(),
                "job_id": int(task_result.id),
                "status": str(getattr(task_result.status, "name", task_result.status)),
            }
        ),
    )


def _make_logger(name: str) -> Callable[..., None]:
    def receiver(**kwargs: Any) -> None:
        assert _INJECTOR is not None
        _INJECTOR._append(
            "signals",
            json.dumps(
                {
                    "signal": name,
                    "pid": os.getpid(),
                    "job_id": kwargs.get("job_id"),
                    "lease": kwargs.get("lease"),
                    "write": kwargs.get("write"),
                }
            ),
        )

    return receiver


def install() -> Injector | None:
    """Install the wrapper described by ``$PGJOBS_FAULT_PLAN`` (no-op without it)."""
    global _INJECTOR
    path = os.environ.get(PLAN_ENV)
    if not path or _INJECTOR is not None:
        return _INJECTOR
    with open(path) as fh:
        _INJECTOR = Injector(json.load(fh))
    _patch_wrapper_class()
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection, weak=False)
    return _INJECTOR
