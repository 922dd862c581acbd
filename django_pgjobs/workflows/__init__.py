"""Workflows and batches: jobs that depend on jobs.

``Workflow`` (a graph), Celery's ``chain``, ``group`` and ``chord``, and ``batch``.
The graph is written in one transaction (``writer``); the database releases each
blocked job in the transaction that finishes its last parent (``db/workflow_trigger.py``);
the worker reads a node's parents' results when it runs (``results``).

Submodules are imported on first use of a name, so importing one of them (the
worker imports ``results``) does not import the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "Batch",
    "Graph",
    "Node",
    "ParentResults",
    "ResultList",
    "Signature",
    "Workflow",
    "WorkflowConflict",
    "WorkflowRun",
    "batch",
    "cancel_workflow",
    "chain",
    "chord",
    "group",
    "workflow_graph",
]

if TYPE_CHECKING:  # pragma: no cover
    from django_pgjobs.workflows.batches import Batch, batch
    from django_pgjobs.workflows.canvas import Node, Workflow, chain, chord, group
    from django_pgjobs.workflows.result_pages import ParentResults, ResultList
    from django_pgjobs.workflows.runs import Graph, WorkflowRun, cancel_workflow, workflow_graph
    from django_pgjobs.workflows.signature import Signature
    from django_pgjobs.workflows.writer import WorkflowConflict


def __getattr__(name: str) -> Any:
    """The public names, each imported from its home on first use (plain imports, so
    the import graph and the layers contract see every edge)."""
    if name in ("Batch", "batch"):
        from django_pgjobs.workflows import batches

        return getattr(batches, name)
    if name in ("Node", "Workflow", "chain", "chord", "group"):
        from django_pgjobs.workflows import canvas

        return getattr(canvas, name)
    if name in ("ParentResults", "ResultList"):
        from django_pgjobs.workflows import result_pages

        return getattr(result_pages, name)
    if name in ("Graph", "WorkflowRun", "cancel_workflow", "workflow_graph"):
        from django_pgjobs.workflows import runs

        return getattr(runs, name)
    if name == "Signature":
        from django_pgjobs.workflows.signature import Signature

        return Signature
    if name == "WorkflowConflict":
        from django_pgjobs.workflows.writer import WorkflowConflict

        return WorkflowConflict
    raise AttributeError(f"module 'django_pgjobs.workflows' has no attribute {name!r}")
