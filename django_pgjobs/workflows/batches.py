"""``with batch(on_complete=...):``: jobs enqueued inside the block join the batch;
its callbacks run once every member has finished and the block has closed it.

Entering writes the batch's row and its callbacks (blocked), in one transaction
(a savepoint of the caller's, if one is open), before any member: a callback's
taken key fails the block's start with nothing written. Every enqueue inside the
block (``.enqueue()``, ``enqueue_many``, ``Job.objects.enqueue``, in this thread or
task: a context variable) stores the batch's id on the row. Leaving closes it in
one transaction: the members are counted (what joined, not the rows left: the
pruner keeps finished members of an unfired batch, and their outcomes are counted
on the batch's row as they finish), and, if they have all finished already, the
callbacks are released at once. Otherwise the member that finishes last releases
them, in the transaction of its own completion (``db/workflow_trigger.py``). A
block that never ends (its process died) is closed by the repair pass
(``maintenance/workflow_repair.py``) once no member has joined for
``PGJOBS["BATCH_ABANDONED_AFTER"]``.

A block left by an exception still closes the batch (its members are enqueued and
will run), unless the exception broke the transaction it ran in (then everything,
batch included, is rolled back anyway).
"""

from __future__ import annotations

import json
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from django_pgjobs.conf import get_settings
from django_pgjobs.db import store
from django_pgjobs.jobs.enqueue import CURRENT_BATCH
from django_pgjobs.support import tracing
from django_pgjobs.workflows.canvas import Node, Workflow, _check_name
from django_pgjobs.workflows.signature import Signature
from django_pgjobs.workflows.writer import insert_nodes, job_rows, node_options

if TYPE_CHECKING:
    from django_pgjobs.models import Job

#: callback option -> the "when" stored on the batch row
WHEN = {"on_complete": "complete", "on_success": "success", "on_failure": "failure"}


class Batch:
    """A batch of jobs (see ``batch``). ``id``: the batch's run id (``Job.workflow_id``
    of its members); after the block, ``members`` (how many jobs joined) and
    ``callbacks`` (their ``Job`` rows, as written when the block opened: blocked until
    the batch fires)."""

    def __init__(self, name: str, callbacks: dict[str, Signature], using: str | None):
        self.name = name
        self.using = using
        self._callbacks = callbacks
        self.id: int | None = None
        self.members: int | None = None
        self.callbacks: list[Job] = []
        self._token: Token[int | None] | None = None

    def __repr__(self) -> str:
        return f"<batch {self.name!r} #{self.id}>"

    @property
    def _alias(self) -> str:
        return self.using or get_settings().DATABASE

    def __enter__(self) -> Batch:
        if self.id is not None:
            raise RuntimeError(f"{self!r} was used already; make a new batch(...)")
        self.id, self.callbacks = self._open()
        self._token = CURRENT_BATCH.set(self.id)
        return self

    def _open(self) -> tuple[int, list[Job]]:
        """Write the batch's row and its callbacks (blocked) in one transaction, before
        any member: a callback whose key is taken raises ``WorkflowConflict`` here,
        with nothing written, and a batch whose block never closes it (its process
        died) has all the repair pass needs to close it."""
        holder = Workflow(self.name)
        holder.kind = "batch"
        nodes = [
            Node(holder, i, sig, (), option, "cancel", "none")
            for i, (option, sig) in enumerate(self._callbacks.items())
        ]
        opts = [node_options(node.signature) for node in nodes]
        alias = self._alias
        with (
            tracing.publish(f"batch {self.name}", "", len(nodes)) as publish,
            transaction.atomic(using=alias),
            connections[alias].cursor() as cursor,
        ):
            carrier = publish.carrier if publish is not None else None
            run_id, ids = store.wf_create(cursor, name=self.name, kind="batch", n=len(nodes))
            columns = [
                {
                    "status": "blocked",
                    "workflow_id": run_id,
                    "node": node.name,
                    "waiting": 1,  # the batch itself
                    "failed_parents": None,
                }
                for node in nodes
            ]
            rows: list[Any] = []
            if nodes:
                rows = insert_nodes(
                    cursor,
                    run_id,
                    ids,
                    nodes,
                    opts,
                    carrier,
                    where=f"batch {self.name!r}",
                    columns=columns,
                )
            stored = [
                {"id": ids[i], "when": WHEN[option], "pass": not sig.immutable}
                for i, (option, sig) in enumerate(self._callbacks.items())
            ]
            store.batch_open(cursor, run_id, json.dumps(stored))
        return run_id, job_rows(alias, nodes, opts, rows, columns, carrier)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            CURRENT_BATCH.reset(self._token)
            self._token = None
        if exc_type is not None and connections[self._alias].needs_rollback:
            return  # the transaction is broken: it rolls back, batch and members alike
        self.close()

    def close(self) -> None:
        """Close the batch (leaving the block does it). Safe to call again after an
        error: a close whose COMMIT landed (its reply lost), or one the repair pass
        made, is recognised and not repeated; one that did not land is done now."""
        if self.id is None:
            raise RuntimeError(f"{self!r} was never entered")
        if self.members is not None:
            return
        with transaction.atomic(using=self._alias), connections[self._alias].cursor() as cursor:
            self.members = close_batch(cursor, self.id, repr(self))


def close_batch(cursor: Any, run_id: int, what: str) -> int:
    """Close batch ``run_id`` in the caller's transaction (the block's end, or the
    repair pass): lock its row, count what joined, fire it if every member has
    finished. Returns how many members joined (a batch closed already: as counted
    then)."""
    state = store.batch_state(cursor, run_id)
    if state is None:
        raise RuntimeError(f"{what}: its row is gone (rolled back?)")
    if state[0]:  # closed already: an earlier close committed, or the repair pass's
        return int(state[1])
    members, due = store.batch_close(cursor, run_id)
    if due:
        store.batch_fire(cursor, run_id)
    return int(members)


def batch(
    *,
    on_complete: Signature | None = None,
    on_success: Signature | None = None,
    on_failure: Signature | None = None,
    name: str = "batch",
    using: str | None = None,
) -> Batch:
    """A context manager: jobs enqueued inside the block join the batch. Once the
    block has ended and every member has finished, ``on_complete`` runs, and
    ``on_success`` (no member dead or cancelled) or ``on_failure`` (some were). A
    callback made with ``.s()`` gets ``{"completed": n, "dead": n, "cancelled": n}``
    as its first argument; each fires exactly once."""
    _check_name(name, "batch(name)")
    callbacks: dict[str, Signature] = {}
    for option, sig in (
        ("on_complete", on_complete),
        ("on_success", on_success),
        ("on_failure", on_failure),
    ):
        if sig is None:
            continue
        if not isinstance(sig, Signature):
            raise TypeError(f"batch({option}=...) must be a signature, my_job.s(...); got {sig!r}")
        sig.check_call("none" if sig.immutable else "first", f"batch({option}={sig!r})")
        callbacks[option] = sig
    return Batch(name, callbacks, using)
