"""Building a graph of jobs: ``Workflow`` and Celery's canvas, ``chain``, ``group``, ``chord``.

Everything is checked while the graph is built (``add`` refuses an unknown parent,
a duplicate name, a bad ``on_parent_failure``, a call that does not fit the job's
signature), so ``enqueue()`` writes all of it or raises before writing anything.
A node can only name nodes added before it as parents, so a graph cannot have a
cycle; ``enqueue`` checks that order again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_pgjobs.support.validation import check_text
from django_pgjobs.workflows.signature import Signature

if TYPE_CHECKING:
    from django_pgjobs.workflows.runs import WorkflowRun

ON_PARENT_FAILURE = ("cancel", "run")


@dataclass(frozen=True, eq=False)
class Node:
    """A job of a workflow, as ``Workflow.add`` returned it (compared by identity)."""

    workflow: Workflow
    index: int
    signature: Signature
    parents: tuple[Node, ...]
    name: str | None
    on_parent_failure: str
    #: how it receives its parents' results as arguments: "none", "first", "list"
    receives: str

    def __repr__(self) -> str:
        label = repr(self.name) if self.name is not None else f"#{self.index}"
        return f"<node {label} {self.signature!r}>"


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise ValueError(
            f"{what} must be a non-empty string of at most 255 characters, got {value!r}"
        )
    try:
        check_text(value, what)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    return value


class Workflow:
    """A graph of jobs enqueued together, in one transaction (the caller's, if open).

    ``wf.add(sig, after=[...])`` returns a node; a node runs once all the nodes in
    its ``after`` have finished. ``wf.enqueue()`` writes it all and returns a
    ``WorkflowRun``. Enqueue it again and you get a second, independent run.
    """

    kind = "workflow"

    def __init__(self, name: str):
        self.name = _check_name(name, "Workflow(name)")
        self.nodes: list[Node] = []
        self._names: set[str] = set()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}: {len(self.nodes)} nodes>"

    def add(
        self,
        signature: Signature,
        after: Node | Iterable[Node] = (),
        *,
        name: str | None = None,
        on_parent_failure: str = "cancel",
    ) -> Node:
        """Add ``signature`` (``my_job.s(...)``) as a node that runs after the nodes of
        ``after`` have all finished. Its parents' results are in
        ``context.parent_results`` (``takes_context=True``), keyed by ``name``
        (default: the parent's job id as a string, so a name of digits alone is
        refused). ``on_parent_failure``: "cancel" (default) cancels it when a parent
        ends dead or cancelled; "run" runs it anyway."""
        parents = self._parents(after)
        return self._add(signature, parents, name=name, on_parent_failure=on_parent_failure)

    def _parents(self, after: Node | Iterable[Node]) -> tuple[Node, ...]:
        items = (after,) if isinstance(after, Node) else after
        if isinstance(items, str | bytes) or not isinstance(items, Iterable):
            raise TypeError(f"after must be a list of nodes returned by add(), got {after!r}")
        parents: list[Node] = []
        for item in items:
            if not isinstance(item, Node):
                raise TypeError(f"after must list nodes returned by add(), got {item!r}")
            if item.workflow is not self:
                raise ValueError(
                    f"after: {item!r} is a node of another workflow ({item.workflow.name!r}),"
                    f" not of {self.name!r}"
                )
            if item in parents:
                raise ValueError(f"after lists {item!r} twice")
            parents.append(item)
        return tuple(parents)

    def _add(
        self,
        signature: Signature,
        parents: Sequence[Node],
        *,
        name: str | None = None,
        on_parent_failure: str = "cancel",
        receives: str = "none",
    ) -> Node:
        if not isinstance(signature, Signature):
            raise TypeError(
                f"a workflow node is a signature, my_job.s(...) or my_job.si(...); got {signature!r}"
            )
        if on_parent_failure not in ON_PARENT_FAILURE:
            raise ValueError(
                f'on_parent_failure must be "cancel" or "run", got {on_parent_failure!r}'
            )
        if name is not None:
            _check_name(name, "name")
            if name.isascii() and name.isdigit():
                raise ValueError(
                    f"name {name!r}: a node's name cannot be all digits (an unnamed parent's"
                    " key in parent_results is its job id as a string, which it would"
                    " collide with)"
                )
            if name in self._names:
                raise ValueError(f"workflow {self.name!r} already has a node named {name!r}")
        if signature.immutable or not parents:
            receives = "none"
        where = f"workflow {self.name!r}, node {name or len(self.nodes)} ({signature!r})"
        signature.check_call(receives, where)
        node = Node(
            self, len(self.nodes), signature, tuple(parents), name, on_parent_failure, receives
        )
        self.nodes.append(node)
        if name is not None:
            self._names.add(name)
        return node

    def enqueue(self, *, using: str | None = None) -> WorkflowRun:
        """Write every node and edge in one transaction (a savepoint inside the
        caller's ``atomic()``): all of it, or nothing and an error."""
        from django_pgjobs.workflows.writer import write

        return write(self, using=using)


# ---------------------------------------------------------------------------
# Celery's canvas: chain, group, chord. Each places itself in a Workflow after a
# set of nodes and returns its last nodes (what comes next waits for them).
# ---------------------------------------------------------------------------

Item = Any  # a Signature, chain, group or chord


def _place(wf: Workflow, item: Item, after: Sequence[Node]) -> list[Node]:
    if isinstance(item, Signature):
        receives = "first" if len(after) == 1 else "list"
        return [wf._add(item, after, receives=receives)]
    if isinstance(item, _Canvas):
        return item._place(wf, after)
    raise TypeError(
        f"chain, group and chord take signatures (my_job.s(...)) or other chains, groups"
        f" and chords; got {item!r}"
    )


class _Canvas:
    kind = "workflow"

    def _place(self, wf: Workflow, after: Sequence[Node]) -> list[Node]:
        raise NotImplementedError

    def _label(self) -> str:
        raise NotImplementedError

    def enqueue(self, *, using: str | None = None) -> WorkflowRun:
        """Enqueue it all in one transaction; the ``WorkflowRun``'s ``.jobs`` are in the
        order of the arguments (a chord: the group's, then the callback)."""
        label = self._label()
        wf = Workflow(label if len(label) <= 255 else label[:252] + "...")
        wf.kind = self.kind
        self._place(wf, [])
        return wf.enqueue(using=using)


def _items(items: Iterable[Item], what: str) -> list[Item]:
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise TypeError(f"{what} takes signatures, got {items!r}")
    out = list(items)
    if not out:
        raise ValueError(f"{what} needs at least one signature")
    return out


class chain(_Canvas):  # named as in Celery
    """Run one after the other; each (made with ``.s()``) gets the previous one's
    result as its first argument. A failure cancels the rest."""

    kind = "chain"

    def __init__(self, *items: Item):
        self.items = _items(items, "chain()")

    def _label(self) -> str:
        return "chain: " + " -> ".join(_short(i) for i in self.items)

    def _place(self, wf: Workflow, after: Sequence[Node]) -> list[Node]:
        last = list(after)
        for item in self.items:
            last = _place(wf, item, last)
        return last


class group(_Canvas):  # named as in Celery
    """Run side by side: ``group(resize.s(i) for i in ids)``."""

    kind = "group"

    def __init__(self, *items: Item):
        if len(items) == 1 and not isinstance(items[0], Signature | _Canvas):
            items = tuple(_items(items[0], "group()"))  # group(a generator or a list)
        self.items = _items(items, "group()")

    def _label(self) -> str:
        names = sorted({_short(i) for i in self.items})
        return f"group of {len(self.items)}: " + ", ".join(names)

    def _place(self, wf: Workflow, after: Sequence[Node]) -> list[Node]:
        out: list[Node] = []
        for item in self.items:
            out.extend(_place(wf, item, after))
        return out


class chord(_Canvas):  # named as in Celery
    """A group, then ``callback``, which (made with ``.s()``) gets the list of the
    group's results, in the group's order, as its first argument."""

    kind = "chord"

    def __init__(self, header: group | Iterable[Item], callback: Item):
        self.header = header if isinstance(header, group) else group(*_items(header, "chord()"))
        if not isinstance(callback, Signature | _Canvas):
            raise TypeError(f"chord's callback must be a signature, got {callback!r}")
        self.callback = callback

    def _label(self) -> str:
        return f"chord: {self.header._label()} -> {_short(self.callback)}"

    def _place(self, wf: Workflow, after: Sequence[Node]) -> list[Node]:
        members = self.header._place(wf, after)
        if isinstance(self.callback, Signature):  # the list of results, even of one member
            return [wf._add(self.callback, members, receives="list")]
        return self.callback._place(wf, members)


def _short(item: Item) -> str:
    if isinstance(item, Signature):
        return item.name.rsplit(".", 1)[-1]
    if isinstance(item, _Canvas):
        return f"({item._label()})"
    return repr(item)
