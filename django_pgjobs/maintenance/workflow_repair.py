"""The workflow repair pass: finds blocked jobs whose counters disagree with their
parents, closed batches that never fired, and open batches whose block never
closed them, and puts them right.

By construction it finds nothing: a parent's move releases or cancels its children
in the same transaction (the trigger of ``db/workflow_trigger.py``), and a crash rolls back
both. What it is for: rows written with triggers disabled
(``session_replication_role = replica``, a restore, logical replication), a parent
deleted by hand, a psql edit; and a batch whose enqueuing process died inside its
``with batch()`` block (autocommit: the batch and its members committed, the close
never ran), closed here once no member has joined for
``PGJOBS["BATCH_ABANDONED_AFTER"]``, counting what joined. It looks at jobs blocked for a minute or more
(``REPAIR_MIN_AGE``): a younger workflow is draining, and its recount would make the
completions wait. Each pass looks at one batch of blocked jobs, in id
order, resuming where the last pass stopped, so a pass stays short however many
jobs wait; anything it repairs is logged as a warning.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections, transaction

from django_pgjobs.conf import get_settings
from django_pgjobs.db import store

logger = logging.getLogger("django_pgjobs")

#: Seconds between passes (there should be nothing to do).
REPAIR_INTERVAL = 60.0

#: Blocked jobs younger than this (seconds since enqueued) are left to the next
#: passes: their workflow is likely draining, and a recount holds the job's row
#: while its parents' completions wait (``db.WF_REPAIR_LOCK``).
REPAIR_MIN_AGE = 60.0


class WorkflowRepair:
    name = "workflow repair"

    def __init__(
        self,
        *,
        alias: str | None = None,
        batch: int = 200,
        min_age: float = REPAIR_MIN_AGE,
        abandoned_after: float | None = None,
    ):
        conf = get_settings()
        self.alias = alias or conf.DATABASE
        self.abandoned_after = (
            conf.BATCH_ABANDONED_AFTER if abandoned_after is None else abandoned_after
        )
        self.interval = REPAIR_INTERVAL
        self.batch = batch
        self.min_age = min_age
        self.after = 0  # the last blocked id looked at (the next pass starts past it)

    def run_once(self) -> dict[str, Any]:
        """Look at one batch of blocked jobs and at closed batches; returns counts."""
        connection = connections[self.alias]
        # Imported here, not at the top: runjobs and the test helpers import the
        # maintenance passes before Django's app registry is ready (settings import
        # django_pgjobs.testing), and batches reach the models through the writer.
        from django_pgjobs.workflows.batches import close_batch

        with transaction.atomic(using=self.alias), connection.cursor() as cursor:
            # the locks first, the recount in the next statement (see WF_REPAIR_LOCK)
            ids = store.wf_repair_lock(
                cursor, after=self.after, batch=self.batch, min_age=self.min_age
            )
            fixed: list[tuple[int, str]] = []
            if ids:
                fixed = store.wf_repair(cursor, ids)
        self.after = ids[-1] if len(ids) == self.batch else 0
        with transaction.atomic(using=self.alias), connection.cursor() as cursor:
            batches = store.batch_repair(cursor, batch=20)
            for run_id in batches:
                store.batch_fire(cursor, run_id)
        with transaction.atomic(using=self.alias), connection.cursor() as cursor:
            # the locks first, each close in the next statements (see BATCH_CLOSE)
            abandoned = store.batch_abandoned(cursor, grace=self.abandoned_after, batch=20)
            closed = [
                (run_id, close_batch(cursor, run_id, f"batch #{run_id}")) for run_id in abandoned
            ]
        for job_id, status in fixed:
            logger.warning(
                "workflow repair: blocked job %s disagreed with its parents; now %s "
                "(were its rows written with triggers disabled, or edited by hand?)",
                job_id,
                status,
                extra={"job_id": job_id},
            )
        for run_id in batches:
            logger.warning(
                "workflow repair: batch #%s had every member finished but had not fired; fired",
                run_id,
            )
        for run_id, members in closed:
            logger.warning(
                "workflow repair: batch #%s was left open (its block never ended: did its "
                "process die?); closed with the %s member(s) that joined",
                run_id,
                members,
            )
        return {
            "looked_at": len(ids),
            "repaired": len(fixed),
            "batches": len(batches),
            "abandoned": len(closed),
        }
