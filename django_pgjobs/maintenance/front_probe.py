"""The claim front's probe: finds the pending jobs before a worker's claim bound that
no NOTIFY announced, so the claims never read the claim index from its start
(``claim_front.py`` says why that read hurt under a held xmin horizon).

One per worker, on its maintenance thread: the bound is the worker's own. A probe that
fails is retried at the next interval like any pass; after ``UNPROBED_AFTER`` seconds
without one the claims sweep again themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections

from django_pgjobs import claim_front
from django_pgjobs.claim_front import ClaimFront
from django_pgjobs.conf import get_settings
from django_pgjobs.db.claim_front import front_probe

#: What the worker's claims cover: its queues (None: every queue) and, when it claims
#: with the known-task filter, its tasks (None: any task).
Scope = Callable[[], tuple[Sequence[str] | None, Sequence[str] | None]]


class FrontProbe:
    name = "claim front"

    def __init__(
        self,
        *,
        front: ClaimFront,
        scope: Scope,
        alias: str | None = None,
        interval: float | None = None,
    ):
        self.front = front
        self.scope = scope
        self.alias = alias or get_settings().DATABASE
        # Read when made, not imported: the fault suite's workers probe more often.
        self.interval = claim_front.PROBE_EVERY if interval is None else interval

    def run_once(self) -> dict[str, Any]:
        """``since``: the bound probed below (None: none, the next claim reads the
        whole index); ``oldest``: the oldest pending job found before it; ``levels``:
        the priorities of the pending jobs from there on."""
        since, began = self.front.probe_begins()
        if since is None:
            self.front.probed(None, began)
            return {"since": None, "oldest": None, "levels": None}
        queues, tasks = self.scope()
        found = front_probe(connections[self.alias], since, queues, tasks)
        self.front.probed(found.oldest, began, found.levels)
        return {"since": since, "oldest": found.oldest, "levels": list(found.levels)}
