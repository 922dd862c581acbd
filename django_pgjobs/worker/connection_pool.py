"""A worker behind Django's own connection pool (``OPTIONS: {"pool": ...}``).

Every thread of a worker holds a connection while it works: each job thread while
its job runs, the claimer, the completer, the heartbeat and the maintenance threads
all the time. Django's pool hands out at most ``max_size`` connections (psycopg_pool's
default: ``min_size``, 4) and makes the next thread wait ``timeout`` (30 s) and then
raise, so a worker of 16 job threads behind a web-sized pool failed jobs with
"couldn't get a connection after 30.00 sec" and left its heartbeat and reaper
waiting. The pool is per process: the worker widens its own to what it would hold
without a pool, before its first connection, and says so.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

logger = logging.getLogger("django_pgjobs")

#: psycopg_pool.ConnectionPool's own default for ``min_size`` (``max_size`` follows it).
POOL_MIN_SIZE_DEFAULT = 4


def own_connections(*, maintenance: int, use_async: bool) -> int:
    """Connections a worker's own threads hold besides its job threads: the claimer
    (the main thread), the completer, the heartbeat, ``maintenance`` threads (the
    reaper, the other passes), the one thread ``async def`` jobs' ORM calls share
    (asgiref's thread-sensitive executor) and the metrics thread of ``runjobs
    --metrics-port`` (counted always: one connection the pool opens only if asked)."""
    return 4 + maintenance + (1 if use_async else 0)


def pool_max_size(options: Any) -> int:
    """The most connections the pool configured by ``OPTIONS["pool"]`` hands out."""
    opts = options if isinstance(options, dict) else {}
    min_size = int(opts.get("min_size", POOL_MIN_SIZE_DEFAULT))
    max_size = opts.get("max_size")
    return min_size if max_size is None else int(max_size)


def fit_pool(alias: str, *, jobs: int, abandoned: int, own: int) -> int | None:
    """Widen ``alias``'s Django pool in this process to the connections a worker can
    hold at once: ``jobs`` job threads, ``abandoned`` more for runs given up on at
    their timeout (their threads may still hold one), ``own`` for its other threads.
    Returns the new ``max_size``, or None when the alias has no pool or it is already
    wide enough. A pool this process already opened is closed first (Django opens a
    new one, with the new size, on the next connection)."""
    wrapper: Any = connections[alias]  # the PostgreSQL wrapper: _connection_pools, close_pool
    options = wrapper.settings_dict.get("OPTIONS", {}).get("pool")
    if not options:
        return None
    need = jobs + abandoned + own
    before = pool_max_size(options)
    if before >= need:
        return None
    if wrapper.in_atomic_block:
        # Closing this thread's connection would end the caller's transaction (a
        # worker started inside atomic(), as in a TestCase): leave the pool as it is.
        logger.warning(
            "database %r: Django's connection pool hands out at most %d connections and "
            "this worker can hold %d at once; it was started inside a transaction, so the "
            "pool cannot be widened (set OPTIONS['pool']['max_size'] to at least %d)",
            alias,
            before,
            need,
            need,
        )
        return None
    widened = dict(options) if isinstance(options, dict) else {}
    widened["max_size"] = need
    wrapper.close()  # give this thread's connection back before the old pool closes
    if alias in wrapper._connection_pools:  # opened here already (not wrapper.pool: it makes one)
        wrapper.close_pool()
    wrapper.settings_dict["OPTIONS"] = {**wrapper.settings_dict["OPTIONS"], "pool": widened}
    logger.warning(
        "database %r: Django's connection pool hands out at most %d connections and this "
        "worker can hold %d at once (%d job threads, %d for runs abandoned at their "
        "timeout, %d of its own), so its pool is widened to max_size=%d in this process "
        "(set OPTIONS['pool']['max_size'] to at least %d, or lower --concurrency, and "
        "this message goes away)",
        alias,
        before,
        need,
        jobs,
        abandoned,
        own,
        need,
        need,
    )
    return need
