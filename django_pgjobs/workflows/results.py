"""A workflow node's parents' results, read by the worker when the node runs.

Read at run time rather than copied into the node when it is released: so the
completion of a chord's last member does not have to read and write every
member's result (no statement of the completion grows with the group), and the
node's own arguments stay as they were enqueued. Only the parents' ids and names
are read before the handler starts; the values are read as the handler uses them
(``result_pages``), so a large chord's results never have to fit in memory at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import connections

from django_pgjobs.db import store
from django_pgjobs.exceptions import ParentResultMissing
from django_pgjobs.workflows.result_pages import Parent, ParentPages, ParentResults, ResultList


def parent_pages(alias: str, job_id: int) -> tuple[ParentPages, str]:
    """Job ``job_id``'s parents in position order (no values yet), and what its
    placement passes it first: "none", "first" (a chain) or "list" (a chord)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(store.PARENT_EDGES, {"id": job_id})
        rows = cursor.fetchall()
    parents = [
        Parent(parent_id, node if node is not None else str(parent_id), stored, packed)
        for parent_id, node, _, stored, packed in rows
    ]
    return ParentPages(alias, parents), rows[-1][2] if rows else "none"


def with_parent_results(
    alias: str, job_id: int, args: list[Any], *, lazy: bool = True
) -> tuple[list[Any], Mapping[str, Any]]:
    """``(args, parent_results)`` for job ``job_id``: its arguments with what its
    placement passes first (a chain: the parent's result; a chord's callback: the
    list of the group's results, in the group's order), and each parent's name ->
    result for ``context.parent_results``.

    ``lazy``: the list and the mapping read the values as they are used, on the
    connection of the thread that uses them (``ResultList``, ``ParentResults``).
    Otherwise (an async job: its handler runs on the event loop, which must not
    wait on a query) they are a plain list and dict, read here."""
    check_parents_present(alias, job_id)
    pages, receives = parent_pages(alias, job_id)
    if receives == "first" and len(pages):
        args = [pages.at(0), *args]
    if lazy:
        if receives == "list":
            args = [ResultList(pages), *args]
        return args, ParentResults(pages)
    values = list(pages)
    if receives == "list":
        args = [values, *args]
    by_name: dict[str, Any] = {}
    for parent, value in zip(pages.parents, values, strict=True):
        by_name[parent.name] = value
    return args, by_name


def check_parents_present(alias: str, job_id: int) -> None:
    """Raise ``ParentResultMissing`` if a parent's row (so its result) is gone: a
    parent that returned ``None`` stores no result, so only its row tells the two
    apart."""
    with connections[alias].cursor() as cursor:
        cursor.execute(store.PARENT_MISSING, {"id": job_id})
        gone = cursor.fetchone()
    if gone is not None:
        raise ParentResultMissing(job_id, gone[0], gone[1])


def plain(value: Any) -> Any:
    """``value`` with every ``ResultList`` / ``ParentResults`` in it made a list /
    dict, so a node may return (or nest in its result) what it was given and store it
    as JSON. Copies only the lists and dicts that hold one. A value nested too deeply
    to walk is given back as it is, for the return value's own check to refuse."""
    try:
        return _plain(value)
    except RecursionError:
        return value


def _plain(value: Any) -> Any:
    if isinstance(value, ResultList):
        return [_plain(item) for item in value]
    if isinstance(value, ParentResults):
        return {name: _plain(item) for name, item in value.items()}
    if isinstance(value, list):
        items = [_plain(item) for item in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        pairs = {key: _plain(item) for key, item in value.items()}
        return pairs if any(pairs[k] is not v for k, v in value.items()) else value
    return value
