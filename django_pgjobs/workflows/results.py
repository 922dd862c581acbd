"""A workflow node's parents' results, read by the worker when the node runs.

Read at run time rather than copied into the node when it is released: so the
completion of a chord's last member does not have to read and write every
member's result (no statement of the completion grows with the group), and the
node's own arguments stay as they were enqueued.
"""

from __future__ import annotations

from typing import Any

from django_pgjobs import decoding
from django_pgjobs.db import workflows as workflow_db


def with_parent_results(
    connection: Any, job_id: int, args: list[Any]
) -> tuple[list[Any], dict[str, Any]]:
    """``(args, parent_results)`` for job ``job_id``: its arguments with what its
    placement passes first (a chain: the parent's result; a chord's callback: the
    list of the group's results, in the group's order), and each parent's name ->
    result for ``context.parent_results``."""
    with connection.cursor() as cursor:
        cursor.execute(workflow_db.PARENT_RESULTS, {"id": job_id})
        rows = cursor.fetchall()
    by_name: dict[str, Any] = {}
    values: list[Any] = []
    receives = "none"
    for parent_id, node, how, value in rows:
        decoded = decoding.loads(value) if isinstance(value, str | bytes) else value
        if isinstance(decoded, decoding.Undecodable):  # this job's failure, with the reason
            raise ValueError(
                f"the stored result of parent job {parent_id} cannot be decoded: "
                f"{getattr(decoded, 'reason', decoded)}"
            )
        by_name[node if node is not None else str(parent_id)] = decoded
        values.append(decoded)
        receives = how
    if receives == "first" and values:
        args = [values[0], *args]
    elif receives == "list":
        args = [values, *args]
    return args, by_name
