"""The statistics pass: ANALYZE the jobs table when it has outgrown the size at which
the sessions' cached plans were made.

Why: the worker's statements are prepared, and PostgreSQL keeps a prepared statement's
generic plan until the statistics or the definition of a table it reads change. A plan
made while the table was small may read it whole: on a table of a page or two a
sequential scan costs less than the primary key, so the claim's UPDATE was planned as
one. The plan stays while the table grows, until autovacuum first analyses it
(``autovacuum_naptime``, a minute by default, later on a busy server): until then every
claim reads the whole growing table, and the time from enqueue to start climbs with it.
The same happens after a quiet spell in which autovacuum
shrank and analysed the table, when a burst arrives.

So every ``runjobs`` checks every ``INTERVAL`` seconds how large the table is against
its size at the last VACUUM or ANALYZE (both invalidate the cached plans), and runs
ANALYZE when it was never analysed, or when it has grown ``GROWTH`` times and past
``FLOOR_PAGES``: a handful of ANALYZEs while a table grows from nothing to its working
size, none while pruning keeps it flat. No leader: ``ANALYZE (SKIP_LOCKED)`` skips
while another worker's (or autovacuum's) runs. A role that does not own the table
checks and does nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

from django_pgjobs.conf import get_settings
from django_pgjobs.db.statistics import job_analyze, job_statistics_age

logger = logging.getLogger("django_pgjobs")

#: Seconds between two checks of one worker.
INTERVAL = 5.0
#: ANALYZE once the table is this many times its size at the last VACUUM or ANALYZE...
GROWTH = 2
#: ... and at least this many pages (1 MiB of 8 kB pages: a read of it costs well
#: under a millisecond).
FLOOR_PAGES = 128


def stale(pages: int, planned: int, never: bool) -> bool:
    """Whether plans made at ``planned`` pages may read a table of ``pages`` badly."""
    if never:
        return pages > 0  # an empty table stays unanalysed (the planner assumes 10 pages)
    return pages >= max(FLOOR_PAGES, GROWTH * planned)


class TableStatistics:
    name = "statistics"
    interval = INTERVAL

    def __init__(self, *, alias: str | None = None):
        self.alias = alias or get_settings().DATABASE

    def run_once(self) -> dict[str, Any]:
        """``analyzed``: whether this pass ran ANALYZE; the sizes it judged by."""
        connection = connections[self.alias]
        pages, planned, never, may = job_statistics_age(connection)
        analyzed = may and stale(pages, planned, never)
        if analyzed:
            # A fresh install's first pass is routine (DEBUG); a grown table's is news.
            logger.log(
                logging.DEBUG if never else logging.INFO,
                "the jobs table has %d pages, %s; analysing it so that cached plans are made again",
                pages,
                "never analysed" if never else f"{planned} at its last VACUUM or ANALYZE",
            )
            job_analyze(connection)
        return {"analyzed": analyzed, "pages": pages, "planned": planned}
