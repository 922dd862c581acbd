"""A job thread's connection after its job: no transaction left open.

Django tracks the transactions it opens (``atomic()``), not a raw ``BEGIN`` a job
sends itself. A job that returned with one open had its writes reported completed and
then rolled back when the connection closed (``CONN_MAX_AGE = 0``), or, with a
persistent connection, made every later job on that thread write into the same
uncommitted transaction, which also held the xmin horizon ("idle in transaction").
"""

from __future__ import annotations

import threading
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.pq import TransactionStatus

_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


class _JobThread(threading.local):
    """A job thread's connection wrappers, by alias. ``connections[alias]`` goes
    through asgiref's ``Local`` and each job made two lookups: a visible share of the
    worker's time holding the GIL in a no-op drain. On a sync thread Django's
    handler is per thread (thread-critical), so the wrapper is the thread's for its
    life unless something deletes it, which nothing does on a job thread. Threads not
    marked by ``serve_jobs`` (a test's main thread, whose rigs do delete it; the
    async jobs' ORM thread) look it up every time."""

    wrappers: dict[str, BaseDatabaseWrapper] | None = None


_thread = _JobThread()


def serve_jobs() -> None:
    """Mark the calling thread as a job thread: its wrappers are looked up once."""
    _thread.wrappers = {}


def _wrapper(alias: str) -> BaseDatabaseWrapper:
    wrappers = _thread.wrappers
    if wrappers is None:
        return connections[alias]
    wrapper = wrappers.get(alias)
    if wrapper is None:
        wrapper = wrappers[alias] = connections[alias]
    return wrapper


def _left_open(wrapper: BaseDatabaseWrapper) -> bool:
    raw = wrapper.connection
    if wrapper.in_atomic_block or raw is None or raw.closed:
        return False
    return raw.info.transaction_status in _OPEN


def left_open(alias: str) -> bool:
    """This thread's connection to ``alias`` is inside a transaction that Django did
    not open (outside any ``atomic()`` block, where it should be idle)."""
    return _left_open(_wrapper(alias))


class _SharedWatch:
    """On the connection of asgiref's thread-sensitive thread, where every ``async
    def`` job's ORM calls run (``sync_to_async``, ``aget``, ``acreate``...): after each
    query sent there, whether it left a raw transaction open. Read from the event
    loop, it answers without a hop to that thread, and without waiting for
    a neighbour's query under way there."""

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self.wrapper = wrapper
        self.open = False
        self.rollbacks = 0  # times the connection was found open and closed

    def __call__(self, execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        try:
            return execute(sql, params, many, context)
        finally:
            self.open = _left_open(self.wrapper)

    def suspect(self) -> bool:
        """A raw transaction may be open: seen after the last query through Django, or
        read now from libpq (a query sent past Django's cursors)."""
        return self.open or _left_open(self.wrapper)

    def close_if_open(self) -> None:
        """On the connection's own thread."""
        if _left_open(self.wrapper):
            self.wrapper.close()
            self.rollbacks += 1
        self.open = False


_watches: dict[str, _SharedWatch] = {}  # per alias


def _install(alias: str) -> _SharedWatch:
    watch = _watches.get(alias)
    if watch is None:
        wrapper = connections[alias]
        watch = _watches[alias] = _SharedWatch(wrapper)
        wrapper.execute_wrappers.append(watch)  # for good: this thread serves only them
    return watch


async def shared_watch(alias: str) -> _SharedWatch:
    watch = _watches.get(alias)
    if watch is None:  # once per process: installed on that thread
        watch = await sync_to_async(_install, thread_sensitive=True)(alias)
    return watch


async def async_left_open(alias: str, since: int) -> bool:
    """What an ``async def`` job wrote through the shared ORM connection since it
    began (epoch ``since``) may have been rolled back: the connection was left
    inside a raw transaction, by this job or one running beside it on the loop. A
    connection found so is closed (the server rolls the transaction back). Queries
    sent from other threads (``thread_sensitive=False``) are not checked."""
    watch = await shared_watch(alias)
    if watch.suspect():
        await sync_to_async(watch.close_if_open, thread_sensitive=True)()
    return watch.rollbacks != since


def tidy(alias: str) -> None:
    """Django's own end-of-request cleanup, on the calling thread: a connection left
    unusable (a restart, a failover) or past ``CONN_MAX_AGE`` is closed. Job threads,
    the async jobs' ORM thread and the loop's executor threads see no request end."""
    _wrapper(alias).close_if_unusable_or_obsolete()


def close(alias: str) -> None:
    """Throw the connection away: the server rolls the transaction back."""
    _wrapper(alias).close()
