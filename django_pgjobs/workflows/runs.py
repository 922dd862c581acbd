"""An enqueued workflow: ``WorkflowRun``, cancelling one, and its graph.

``workflow_graph`` is the seam for the admin's workflow page: a run's nodes with
their statuses and its edges, in two bounded queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db import connections, transaction

from django_pgjobs.conf import get_settings
from django_pgjobs.db import store
from django_pgjobs.jobs import operations

if TYPE_CHECKING:
    from django_pgjobs.models import Job


@dataclass
class WorkflowRun:
    """What ``enqueue()`` of a workflow, chain, group or chord returns: the run's id
    (``Job.workflow_id`` of each of its jobs) and its ``Job`` rows, in the order they
    were added (a chord: the group's, then the callback)."""

    id: int
    name: str
    kind: str
    jobs: list[Job] = field(default_factory=list)
    using: str | None = None

    def cancel(self) -> int:
        """Cancel every job of the run that has not finished; returns how many."""
        return cancel_workflow(self.id, using=self.using)

    def retry_failed(self) -> int:
        """Retry the run's failed nodes; their cancelled dependents resume."""
        return retry_failed(self.id, using=self.using)

    def graph(self, limit: int = 5000) -> Graph:
        return workflow_graph(self.id, using=self.using, limit=limit)


def cancel_workflow(run_id: int, *, using: str | None = None) -> int:
    """Cancel every blocked, waiting, pending or running job of run ``run_id`` (a running job's
    result is fenced off; its ``context.is_cancelled()`` turns true) and mark the run
    cancelled. Returns how many jobs changed. Joins the caller's transaction."""
    alias = using or get_settings().DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        return store.wf_cancel(cursor, run_id)


@dataclass(frozen=True)
class GraphNode:
    id: int
    name: str  # the node's name, or its id as a string
    task: str
    queue: str
    status: str
    waiting: int | None
    failed_parents: int | None
    cancelled_by: int | None
    last_error: str | None


@dataclass(frozen=True)
class GraphEdge:
    parent: int
    child: int
    position: int
    on_parent_failure: str
    receives: str


@dataclass(frozen=True)
class Graph:
    """A run's nodes (in id order, at most ``limit``) and the edges between them."""

    nodes: list[GraphNode]
    edges: list[GraphEdge]
    truncated: bool


def workflow_graph(run_id: int, *, using: str | None = None, limit: int = 5000) -> Graph:
    """The nodes and edges of run ``run_id`` with each node's status now: two
    queries, each bounded by ``limit`` nodes."""
    alias = using or get_settings().DATABASE
    with connections[alias].cursor() as cursor:
        cursor.execute(store.WF_NODES, {"id": run_id, "limit": limit + 1})
        node_rows = cursor.fetchall()
        cursor.execute(store.WF_EDGES, {"id": run_id, "limit": limit})
        edge_rows = cursor.fetchall()
    nodes = [
        GraphNode(r[0], r[1] if r[1] is not None else str(r[0]), *r[2:]) for r in node_rows[:limit]
    ]
    return Graph(nodes, [GraphEdge(*r) for r in edge_rows], truncated=len(node_rows) > limit)


#: The statuses in the order the admin lists them (waiting first, finished last).
STATUS_ORDER = ("blocked", "waiting", "pending", "running", "completed", "dead", "cancelled")
FINISHED = frozenset({"completed", "dead", "cancelled"})


@dataclass(frozen=True)
class Progress:
    """A run's nodes by status. ``capped``: only the first nodes were counted."""

    counts: dict[str, int]
    capped: bool = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> int:
        return sum(n for s, n in self.counts.items() if s in FINISHED)


def run_progress(run_id: int, *, using: str | None = None) -> Progress:
    """The exact count of run ``run_id``'s nodes by status (one query)."""
    alias = using or get_settings().DATABASE
    with connections[alias].cursor() as cursor:
        cursor.execute(store.WF_STATUS_COUNTS, {"id": run_id})
        return Progress(dict(cursor.fetchall()))


def runs_progress(run_ids: list[int], *, cap: int, using: str | None = None) -> dict[int, Progress]:
    """The progress of several runs (a list page) in one query, counting at most
    ``cap`` nodes of each: a larger run's ``Progress`` is ``capped``."""
    alias = using or get_settings().DATABASE
    counts: dict[int, dict[str, int]] = {run_id: {} for run_id in run_ids}
    with connections[alias].cursor() as cursor:
        cursor.execute(store.WF_LIST_PROGRESS, {"ids": run_ids, "cap": cap + 1})
        for run_id, status, n in cursor.fetchall():
            counts[run_id][status] = n
    result = {}
    for run_id, by_status in counts.items():
        capped = sum(by_status.values()) > cap
        result[run_id] = Progress(by_status, capped=capped)
    return result


@dataclass(frozen=True)
class Sample:
    """What the graph draws of a run: at most ``head`` + ``tail`` nodes (id order;
    each ``(id, name, task, status)``) and the edges into them (at most
    ``edge_limit``; ``edges_truncated`` when there were more)."""

    nodes: list[tuple[int, str, str, str]]
    edges: list[tuple[int, int]]
    complete: bool  # every node of the run is in ``nodes``
    edges_truncated: bool


def graph_sample(
    run_id: int, *, head: int, tail: int, edge_limit: int, using: str | None = None
) -> Sample:
    """The first ``head`` and last ``tail`` nodes of run ``run_id`` and the edges into
    them: two queries, bounded whatever the size of the run."""
    alias = using or get_settings().DATABASE
    with connections[alias].cursor() as cursor:
        cursor.execute(store.WF_GRAPH_NODES, {"id": run_id, "head": head + 1, "tail": tail})
        rows = cursor.fetchall()
        first = [r for r in rows if r[4]]
        last_ids = {r[0] for r in rows if not r[4]}
        # head + 1 rows asked for: the extra one is drawn only if the tail has it too
        complete = len(first) <= head or first[-1][0] in last_ids
        if len(first) > head and not complete:
            rows = [r for r in rows if r[0] != first[-1][0]]
        by_id = {r[0]: (r[0], r[1] if r[1] is not None else str(r[0]), r[2], r[3]) for r in rows}
        nodes = sorted(by_id.values())
        cursor.execute(
            store.WF_GRAPH_EDGES,
            {"ids": [n[0] for n in nodes], "limit": edge_limit + 1},
        )
        edges = cursor.fetchall()
    return Sample(nodes, [(p, c) for p, c in edges[:edge_limit]], complete, len(edges) > edge_limit)


def retry_failed(run_id: int, *, using: str | None = None) -> int:
    """Retry run ``run_id``'s failed nodes (dead, or cancelled on their own) whose
    parents all completed; the trigger then resumes the dependents their failure
    cancelled. Returns how many were retried. A node failed below another failed
    node waits for the next call (once its parent has completed)."""
    alias = using or get_settings().DATABASE
    with connections[alias].cursor() as cursor:
        cursor.execute(store.WF_FAILED_ROOTS, {"id": run_id})
        ids = [r[0] for r in cursor.fetchall()]
    return len(operations.retry(ids, using=alias).changed)
