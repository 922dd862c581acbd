"""The LISTEN connection: wakes the worker loop when a job is enqueued.

A dedicated psycopg connection (not Django's: it blocks waiting for
notifications). It reconnects with backoff and re-issues LISTEN after a server
restart or a killed backend; while it is down the worker's poll still finds work.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from django_pgjobs.db.notify import LISTEN, LISTEN_KEEPALIVE
from django_pgjobs.support.pgconn import psycopg_params, set_up_session
from django_pgjobs.support.throttle import Backoff

logger = logging.getLogger("django_pgjobs")

#: How long one wait for notifications lasts: how soon the thread sees a stop (a
#: worker's shutdown joins this thread: a burst run ends no later than this after
#: its last job).
STOP_CHECK = 0.2
#: Seconds between keep-alive statements on an idle connection.
KEEPALIVE_EVERY = 1.0


class Listener(threading.Thread):
    #: The class the LISTEN connection is made of. A ``psycopg.Connection`` subclass
    #: may be set here to observe its calls (the fault suite's injector does:
    #: tests/faults/injector.py); Django's ``execute_wrappers`` never see this one.
    connection_class: type[psycopg.Connection[Any]] = psycopg.Connection

    def __init__(self, alias: str, on_notify: Callable[[str], None], stop: threading.Event):
        super().__init__(name="pgjobs-listener", daemon=True)
        self.alias = alias
        self.on_notify = on_notify
        self.stop = stop
        self.connected = threading.Event()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self.connection_class.connect(**psycopg_params(self.alias), autocommit=True)
        set_up_session(conn, self.alias)
        conn.execute(LISTEN)
        return conn

    def run(self) -> None:
        backoff = Backoff("listen connection")
        while not self.stop.is_set():
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = self._connect()
                self.connected.set()
                backoff.succeeded()
                # A reconnect may have missed notifications: wake the loop once.
                self.on_notify("")
                kept_alive = time.monotonic()
                while not self.stop.is_set():
                    for note in conn.notifies(timeout=STOP_CHECK):
                        self.on_notify(note.payload)
                    if time.monotonic() - kept_alive >= KEEPALIVE_EVERY:
                        # Keep-alive: a silently dead connection raises here.
                        conn.execute(LISTEN_KEEPALIVE)
                        kept_alive = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                self.connected.clear()
                if self.stop.is_set():
                    break
                backoff.failed(exc)
                self.stop.wait(backoff.delay())
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):  # closing a broken connection
                        conn.close()
