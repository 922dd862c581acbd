"""A job thread's connection after its job: no transaction left open.

Django tracks the transactions it opens (``atomic()``), not a raw ``BEGIN`` a job
sends itself. A job that returned with one open had its writes reported completed and
then rolled back when the connection closed (``CONN_MAX_AGE = 0``), or, with a
persistent connection, made every later job on that thread write into the same
uncommitted transaction, which also held the xmin horizon ("idle in transaction").
"""

from __future__ import annotations

from django.db import connections
from psycopg.pq import TransactionStatus


def left_open(alias: str) -> bool:
    """This thread's connection to ``alias`` is inside a transaction that Django did
    not open (outside any ``atomic()`` block, where it should be idle)."""
    wrapper = connections[alias]
    raw = wrapper.connection
    if wrapper.in_atomic_block or raw is None or raw.closed:
        return False
    return raw.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)


def tidy(alias: str) -> None:
    """Django's own end-of-request cleanup, on the calling thread: a connection left
    unusable (a restart, a failover) or past ``CONN_MAX_AGE`` is closed. Job threads,
    the async jobs' ORM thread and the loop's executor threads see no request end."""
    connections[alias].close_if_unusable_or_obsolete()


def close(alias: str) -> None:
    """Throw the connection away: the server rolls the transaction back."""
    connections[alias].close()
