"""Statement-level fault injection through Django's ``connection.execute_wrapper``.

Test-only code: ``tests/settings.py`` calls :func:`install` when the environment
variable ``PGJOBS_FAULT_PLAN`` names a JSON plan file, so a ``runjobs`` subprocess
(or the driver, ``tests/faults/driver.py``) wraps every database call of every
thread. Production code has no hook: the test process patches Django's PostgreSQL
``DatabaseWrapper`` so each connection object carries the wrapper from birth.

A plan (JSON object):

``statement``  name of the statement to fault (see :func:`statement_name`), or
               ``"*read"``: every read-only statement; absent: log only;
``mode``       ``raise``: fail before reaching the server; ``ambiguous``: run it
               (it commits in autocommit), then close the connection and raise, so
               the client cannot tell; ``terminate``: run it inside a transaction,
               then ``pg_terminate_backend`` the session from a second connection
               while it sleeps, before COMMIT (the server rolls it back);
``skip``       matching calls to let through first (default 0);
``times``      how many calls to fault (default 1; 0 = all);
``linger``     ambiguous only: seconds between the commit and the error (a slow
               connection loss: other threads carry on meanwhile);
``fired``      file to append one line to per injected fault;
``log``        file to append every statement's name to (coverage capture);
``texts``      file to append ``[name, text]`` of every statement to;
``signals``    file to append job_succeeded/failed/dead/fenced signals to.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

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


def sql_constants() -> dict[str, str]:
    """Module-level SQL constants of ``django_pgjobs.sql``: name -> text."""
    from django_pgjobs import sql

    out = {}
    for name, value in vars(sql).items():
        if (
            name.isupper()
            and not name.startswith("_")
            and isinstance(value, str)
            and re.match(r"\s*(SELECT|WITH|INSERT|UPDATE|DELETE|CREATE|DROP)\b", value)
        ):
            out[name] = value
    # The claims are compiled from Job.objects.claimable on first use, not module text.
    out.update(sql.claim_statements())
    return out


def skew_constants() -> dict[str, str]:
    """The SQL constants of ``django_pgjobs.worker.skew`` (the unknown-task sweeper's)."""
    from django_pgjobs.worker import skew

    return {
        name: value
        for name, value in vars(skew).items()
        if name.isupper()
        and not name.startswith("_")
        and isinstance(value, str)
        and re.match(r"\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", value)
    }


_PATTERNS: list[tuple[str, re.Pattern[str]]] | None = None


def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    global _PATTERNS
    if _PATTERNS is None:
        pats = []
        named = {f"sql.{n}": t for n, t in sql_constants().items()}
        named.update({f"skew.{n}": t for n, t in skew_constants().items()})
        for name, text in named.items():
            # JOB_BY_KEY is formatted with its column list at import time.
            body = re.escape(_normal(text)).replace(r"\{columns\}", ".+?")
            body = body.replace(r"\{\{columns\}\}", ".+?")
            pats.append((name, re.compile(body + r"\Z", re.DOTALL)))
        _PATTERNS = pats
    return _PATTERNS


def statement_name(sql_text: str) -> str:
    """``sql.JOB_CLAIM_ALL``-style name for a constant of sql.py (``skew.NAME`` for the
    unknown-task sweeper's statements, kept in skew.py); ``orm:...`` for an
    ORM statement on a pgjobs table (a stable digest of its shape); ``other:...``."""
    text = _normal(sql_text)
    for name, pattern in _patterns():
        if pattern.match(text):
            return name
    tables = sorted(set(_TABLE.findall(text)))
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
            hit = name == self.target
        if not hit:
            return False
        with self.lock:
            self.seen += 1
            if self.seen <= self.skip or (self.times and self.fired >= self.times):
                return False
            self.fired += 1
            return True

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
        self._append(
            "fired",
            json.dumps(
                {
                    "statement": name,
                    "mode": self.mode,
                    "pid": os.getpid(),
                    "thread": threading.current_thread().name,
                }
            ),
        )
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
        from django.db import OperationalError

        execute(sql_text, params, many, context)  # in autocommit: committed now
        time.sleep(float(self.plan.get("linger", 0)))
        db = context["connection"]
        db.errors_occurred = True
        with contextlib.suppress(Exception):  # the connection may be half broken already
            db.connection.close()
        raise OperationalError(
            "pgjobs fault injection: server closed the connection before "
            "the reply (the statement may have committed)"
        )

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


_INJECTOR: Injector | None = None


def _patch_wrapper_class() -> None:
    """Every Django connection object gets the wrapper from birth, on every thread
    (``sql.hot_cursor`` takes Django's ordinary cursor when wrappers are installed)."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    original = DatabaseWrapper.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.execute_wrappers.append(_INJECTOR)

    DatabaseWrapper.__init__ = __init__  # type: ignore[method-assign]


def _on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    _connect_signals()


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
