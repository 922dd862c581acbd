"""What ``runjobs`` tells a user about the queues it was asked to serve: a queue name
nothing enqueues to (a typo such as ``emials``), and why a ``--burst`` run did nothing.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from django.db import DatabaseError, connections

from django_pgjobs.db.reports import PENDING_PER_QUEUE
from django_pgjobs.queues import declared_queues


def queues_with_jobs(alias: str) -> dict[str, int]:
    """Pending jobs per queue (read from the partial claim index)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(PENDING_PER_QUEUE)
        return {str(q): int(n) for q, n in cursor.fetchall()}


def unknown_queue_warnings(requested: Sequence[str], alias: str) -> list[str]:
    """One warning per requested queue that no code declares and no pending job uses."""
    declared = declared_queues()
    try:
        live = queues_with_jobs(alias)
    except DatabaseError:
        live = {}
        connections[alias].close()
    known = declared | set(live)
    out = []
    for name in requested:
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        out.append(
            f"queue {name!r}: no @job, PGJOBS['QUEUES'] or CRON entry uses it and no pending "
            f"job is on it, so this worker may wait for ever.{hint} "
            f"Known queues: {', '.join(sorted(known))}."
        )
    return out


def idle_burst_explanation(queues: Sequence[str] | None, alias: str) -> tuple[bool, str]:
    """Why a ``--burst`` worker claimed nothing; True when that deserves a warning (jobs
    wait on queues it was not asked to serve)."""
    try:
        live = queues_with_jobs(alias)
    except DatabaseError:
        connections[alias].close()
        return False, "nothing was due"
    served = sorted(live) if queues is None else [q for q in queues if q in live]
    elsewhere = {q: n for q, n in live.items() if queues is not None and q not in queues}
    if served:
        return False, (
            f"nothing was due yet on {', '.join(served)} (their pending jobs have a later run_at)"
        )
    if elsewhere:
        shown = ", ".join(f"{q} ({n})" for q, n in sorted(elsewhere.items()))
        return True, (
            f"nothing was pending on {', '.join(queues or [])}; pending jobs wait "
            f"on other queues: {shown}. Pass --queues with those names, or omit "
            "--queues to serve every queue."
        )
    return False, "nothing was pending"
