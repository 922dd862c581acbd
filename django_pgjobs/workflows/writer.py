"""Writing a graph of jobs: one workflow row, then its nodes and edges, in one
transaction (a savepoint inside the caller's ``atomic()``; no ``on_commit``).

Round trips: one for the workflow row and every node's id (allocated in node
order, so edges can be written with the nodes), one per ``CHUNK`` nodes (a
multi-row insert of the nodes with their edges), the NOTIFY riding on the last.
A 10,000-job chord is three statements.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from django_pgjobs.conf import get_settings
from django_pgjobs.db import readiness, store
from django_pgjobs.jobs.enqueue import flow_keys, resolve_options
from django_pgjobs.jobs.job_rows import new_job
from django_pgjobs.models import Job
from django_pgjobs.support import tracing
from django_pgjobs.workflows.runs import WorkflowRun

if TYPE_CHECKING:
    from django_pgjobs.workflows.canvas import Node, Workflow
    from django_pgjobs.workflows.signature import Signature

#: Nodes per insert statement.
CHUNK = 5000

#: The array parameters of WF_INSERT_NODES (one item per node, or per edge: e_*).
_ARRAYS = (
    *("ids", "tasks", "queues", "priorities", "args", "kwargs", "run_at", "delay"),
    *("max_attempts", "idempotency_keys", "timeouts", "concurrency_keys"),
    *("concurrency_limits", "unique_keys", "statuses", "nodes", "waiting", "failed_parents"),
    "fair_keys",
    *("e_child", "e_position", "e_parent", "e_parent_node", "e_on_failure", "e_receives"),
)


class WorkflowConflict(ValueError):
    """A node's idempotency or unique_while key is taken: nothing was enqueued."""


def node_options(signature: Signature) -> dict[str, Any]:
    """The row values of one node (the options of ``resolve_options``, with its
    keys computed from its own arguments; a node never joins a ``batch()``)."""
    definition = signature.definition
    opts = resolve_options(definition, signature.options)
    opts["workflow_id"] = None
    flow_keys(definition, signature.args, signature.kwargs, opts)
    return opts


def _check_order(nodes: Sequence[Node]) -> None:
    for node in nodes:
        for parent in node.parents:
            if parent.index >= node.index:
                raise ValueError(
                    f"workflow {node.workflow.name!r} has a cycle through {node!r}: "
                    "a node can only run after nodes added before it"
                )


@readiness.names_the_fix("enqueue a workflow")
def write(workflow: Workflow, *, using: str | None = None) -> WorkflowRun:
    nodes = list(workflow.nodes)
    if not nodes:
        raise ValueError(f"workflow {workflow.name!r} has no nodes: add() some first")
    _check_order(nodes)
    opts = [node_options(node.signature) for node in nodes]
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    first = nodes[0].signature
    with (
        tracing.publish(first.name, opts[0]["queue"], len(nodes)) as publish,
        transaction.atomic(using=alias),
        connection.cursor() as cursor,
    ):
        carrier = publish.carrier if publish is not None else None
        run_id, ids = store.wf_create(cursor, name=workflow.name, kind=workflow.kind, n=len(nodes))
        rows = insert_nodes(
            cursor, run_id, ids, nodes, opts, carrier, where=f"workflow {workflow.name!r}"
        )
    columns = [node_columns(run_id, node) for node in nodes]
    jobs = job_rows(alias, nodes, opts, rows, columns, carrier)
    return WorkflowRun(id=run_id, name=workflow.name, kind=workflow.kind, jobs=jobs, using=alias)


def job_rows(
    alias: str,
    nodes: Sequence[Node],
    opts: Sequence[dict[str, Any]],
    rows: Sequence[tuple[Any, ...]],
    columns: Sequence[dict[str, Any]],
    carrier: dict[str, str] | None,
) -> list[Job]:
    """The ``Job`` rows of written nodes, built from what was sent and what the insert
    returned (as ``enqueue`` builds one job's)."""
    return [
        new_job(
            Job,
            alias,
            row,
            node.signature.name,
            o,
            node.signature.args,
            node.signature.kwargs,
            carrier,
            overrides=c,
        )
        for node, o, row, c in zip(nodes, opts, rows, columns, strict=True)
    ]


def node_columns(run_id: int, node: Node) -> dict[str, Any]:
    """The workflow columns of a node's row."""
    return {
        "status": "blocked" if node.parents else "pending",
        "workflow_id": run_id,
        "node": node.name,
        "waiting": len(node.parents),
        "failed_parents": 0 if node.parents else None,
    }


def insert_nodes(
    cursor: Any,
    run_id: int,
    ids: Sequence[int],
    nodes: Sequence[Node],
    opts: Sequence[dict[str, Any]],
    carrier: dict[str, str] | None,
    *,
    where: str,
    columns: Sequence[dict[str, Any]] | None = None,
) -> list[tuple[Any, ...]]:
    """Insert ``nodes`` (ids ``ids``, already allocated) with their edges in chunks;
    returns each node's (id, run_at, created_at) in node order. Raises
    ``WorkflowConflict`` when a node's key is taken (the caller's transaction block
    rolls everything back). ``columns``: the workflow columns of each node (default
    from its place in the graph)."""
    by_id: dict[int, tuple[Any, ...]] = {}
    cols = columns if columns is not None else [node_columns(run_id, node) for node in nodes]
    queues = sorted(
        {o["queue"] for o, c in zip(opts, cols, strict=True) if c["status"] == "pending"}
    )
    for start in range(0, len(nodes), CHUNK):
        chunk = range(start, min(start + CHUNK, len(nodes)))
        params = _chunk_params(run_id, ids, nodes, opts, chunk, cols)
        params["trace_context"] = None if carrier is None else json.dumps(carrier)
        params["notify"] = queues if chunk.stop == len(nodes) else []
        for row in store.wf_insert_nodes(cursor, params):
            if row[0] is not None:
                by_id[row[0]] = row
    missing = [i for i in range(len(nodes)) if ids[i] not in by_id]
    if missing:
        node, o = nodes[missing[0]], opts[missing[0]]
        held = [
            f"{what} {o[key]!r}"
            for what, key in (("idempotency key", "idempotency_key"), ("unique key", "unique_key"))
            if o.get(key) is not None
        ]
        raise WorkflowConflict(
            f"{where}: {node!r} was not enqueued: a job with its {' or '.join(held)} "
            f"already exists; nothing of the {where.split()[0]} was enqueued"
        )
    return [by_id[ids[i]] for i in range(len(nodes))]


def _chunk_params(
    run_id: int,
    ids: Sequence[int],
    nodes: Sequence[Node],
    opts: Sequence[dict[str, Any]],
    chunk: range,
    columns: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    params: dict[str, list[Any]] = {name: [] for name in _ARRAYS}
    for i in chunk:
        node, o = nodes[i], opts[i]
        sig = node.signature
        col = columns[i]
        run_at, delay = o["run_at"], o["delay"]
        for name, value in (
            ("ids", ids[i]),
            ("tasks", sig.name),
            ("queues", o["queue"]),
            ("priorities", o["priority"]),
            ("args", sig.args_text),
            ("kwargs", sig.kwargs_text),
            ("run_at", None if run_at is None else run_at.isoformat()),
            ("delay", None if delay is None else delay.total_seconds()),
            ("max_attempts", o["max_attempts"]),
            ("idempotency_keys", o["idempotency_key"]),
            ("timeouts", o["timeout"]),
            ("concurrency_keys", o["concurrency_key"]),
            ("concurrency_limits", o["concurrency_limit"]),
            ("unique_keys", o["unique_key"]),
            ("statuses", col["status"]),
            ("nodes", col["node"]),
            ("waiting", col["waiting"]),
            ("failed_parents", col["failed_parents"]),
            ("fair_keys", o["fair_key"]),
        ):
            params[name].append(value)
        for position, parent in enumerate(node.parents):
            params["e_child"].append(ids[i])
            params["e_position"].append(position)
            params["e_parent"].append(ids[parent.index])
            params["e_parent_node"].append(parent.name)
            params["e_on_failure"].append(node.on_parent_failure)
            params["e_receives"].append(node.receives)
    return {"workflow": run_id, **params}
