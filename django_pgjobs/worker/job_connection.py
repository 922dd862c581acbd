"""A job thread's connection after its job: no transaction left open.

Django tracks the transactions it opens (``atomic()``), not a raw ``BEGIN`` a job
sends itself. A job that returned with one open had its writes reported completed and
then rolled back when the connection closed (``CONN_MAX_AGE = 0``), or, with a
persistent connection, made every later job on that thread write into the same
uncommitted transaction, which also held the xmin horizon ("idle in transaction").
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.pq import TransactionStatus

# Per alias: the connection wrapper of asgiref's thread-sensitive thread, where every
# ``async def`` job's ORM calls run (``sync_to_async``, ``aget``, ``acreate``...).
_shared_async: dict[str, BaseDatabaseWrapper] = {}
_rollbacks: dict[str, int] = {}  # per alias: times that connection was found open


def left_open(alias: str) -> bool:
    """This thread's connection to ``alias`` is inside a transaction that Django did
    not open (outside any ``atomic()`` block, where it should be idle)."""
    wrapper = connections[alias]
    raw = wrapper.connection
    if wrapper.in_atomic_block or raw is None or raw.closed:
        return False
    return raw.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)


def _close_if_left_open(alias: str) -> bool:
    if left_open(alias):
        close(alias)
        _rollbacks[alias] = _rollbacks.get(alias, 0) + 1
        return True
    return False


def async_epoch(alias: str) -> int:
    """How many times the shared async connection was rolled back so far; a job that
    began before a rollback and ends after it may have written into what was lost."""
    return _rollbacks.get(alias, 0)


async def async_left_open(alias: str, since: int) -> bool:
    """What an ``async def`` job wrote through the shared ORM connection since it
    began (epoch ``since``) may have been rolled back: the connection was left
    inside a raw transaction, by this job or one running beside it on the loop. A
    connection found so is closed (the server rolls the transaction back).

    The connection lives on another thread, so the check hops there only when the
    status read from here is not idle: a hop per job cost ~140 us. Jobs that sent
    their queries from other threads (``thread_sensitive=False``) are not checked."""
    wrapper = _shared_async.get(alias)
    if wrapper is None:
        wrapper = await sync_to_async(connections.__getitem__, thread_sensitive=True)(alias)
        _shared_async[alias] = wrapper
    raw = wrapper.connection
    if raw is None or raw.closed or raw.info.transaction_status == TransactionStatus.IDLE:
        # a field of the libpq connection; on its thread a query may be under way
        # (ACTIVE), so anything but IDLE is settled there, after that query
        return async_epoch(alias) != since
    closed = await sync_to_async(_close_if_left_open, thread_sensitive=True)(alias)
    return closed or async_epoch(alias) != since


def tidy(alias: str) -> None:
    """Django's own end-of-request cleanup, on the calling thread: a connection left
    unusable (a restart, a failover) or past ``CONN_MAX_AGE`` is closed. Job threads,
    the async jobs' ORM thread and the loop's executor threads see no request end."""
    connections[alias].close_if_unusable_or_obsolete()


def close(alias: str) -> None:
    """Throw the connection away: the server rolls the transaction back."""
    connections[alias].close()
