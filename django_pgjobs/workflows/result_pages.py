"""A node's parents' results read in bounded pages, while the node runs.

A chord of 10,000 members with results of 1 MiB holds 10 GB of results: read at
once (the rows, their text, the decoded values), they would need several times that
in one worker. ``ResultList`` (the chord's list) and ``ParentResults``
(``context.parent_results``) hold only the parents' ids and names; values are read
when asked for, a page at a time, and only the last page read is kept. A page is
at most ``PAGE_BYTES`` of stored values; a larger (or compressed) value is a page of
its own, streamed in pieces of ``PIECE_BYTES`` and grown as they come, so the driver
never holds its whole text beside it and a string needs no second copy to decode.
A callback that walks every result needs the memory of the one being read and of
those it keeps itself (a ``for`` loop keeps the previous one while the next is read),
not of all.

The page is read on the connection of the thread that asks (the job's own, in a
worker thread), each page its own statement: no cursor or transaction stays open
between pages, so the job's transactions are its own.
"""

from __future__ import annotations

import codecs
import functools
import operator
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, overload

import psycopg
from django.db import connections
from django.db.backends.utils import CursorWrapper

from django_pgjobs.db import store
from django_pgjobs.support import decoding

#: Stored bytes of the values read by one statement (a larger value is read alone).
PAGE_BYTES = 256 * 1024
#: Values read by one statement at most (small or empty results).
PAGE_ROWS = 1000
#: Bytes of a large value's text sent in one row of its stream.
PIECE_BYTES = 64 * 1024


class Parent(NamedTuple):
    """One edge of the node, as read when it starts (no value yet)."""

    job_id: int
    name: str
    #: bytes its value takes where it is stored; None: no value stored
    stored: int | None
    #: stored compressed: its size as text is unknown, so it is read alone
    packed: bool


def decode(parent_id: int, text: Any) -> Any:
    """A stored result as Python; a value that cannot be decoded is this job's
    failure, with the reason (never a placeholder passed on as if it were a result)."""
    value = decoding.loads(text) if isinstance(text, str | bytes) else text
    if isinstance(value, decoding.Undecodable):
        raise ValueError(
            f"the stored result of parent job {parent_id} cannot be decoded: "
            f"{getattr(value, 'reason', value)}"
        )
    return value


def _page_starts(parents: Sequence[Parent]) -> list[int]:
    """Where each page begins: a page ends before the value that would take it past
    ``PAGE_BYTES`` or ``PAGE_ROWS``, and a compressed value is a page of its own."""
    starts: list[int] = []
    size = rows = 0
    alone = False  # the page so far is one compressed value
    for i, parent in enumerate(parents):
        stored = parent.stored or 0
        full = alone or parent.packed or rows >= PAGE_ROWS or size + stored > PAGE_BYTES
        if not starts or (rows and full):
            starts.append(i)
            size = rows = 0
        size += stored
        rows += 1
        alone = parent.packed
    return starts


def _streamed(parent: Parent) -> bool:
    """A value read alone, in pieces: one larger than a page, or compressed (its size
    as text unknown)."""
    return parent.stored is not None and (parent.packed or parent.stored > PAGE_BYTES)


def _gone(parent_id: int) -> ValueError:
    return ValueError(
        f"the stored result of parent job {parent_id} is gone: it was "
        "deleted while the job was reading its parents' results"
    )


def read_streamed(alias: str, parent_id: int) -> Any:
    """Parent ``parent_id``'s result, read as a stream of ``PIECE_BYTES`` rows (one row
    in the driver at a time) through the connection's ``execute_wrappers``, as
    ``execute`` would go (psycopg's ``stream`` bypasses them otherwise; so the fault
    suite's injector sees it too)."""
    db = connections[alias]
    with db.cursor() as cursor:
        executor: Any = _stream_executor
        for wrapper in reversed(db.execute_wrappers):  # the order Django applies them in
            executor = functools.partial(wrapper, executor)
        found = executor(
            store.PARENT_RESULT_PIECES,
            {"id": parent_id, "piece": PIECE_BYTES},
            False,
            {"connection": db, "cursor": cursor},
        )
    if found is None:
        raise _gone(parent_id)
    plain, text = found
    return text if plain else decode(parent_id, text)


def _stream_executor(
    sql: str, params: Any, many: bool, context: dict[str, Any]
) -> tuple[bool, str] | None:
    """``(is a string, its text or JSON)`` from the stream, or None: no row (gone).

    The pieces come in binary format, on a cursor of the connection's own that binds
    on the server (Django's binds on the client, which psycopg allows text results
    only): as text, a ``bytea`` piece is twice its size in hex, so the driver's input
    buffer and each row would hold double and the hex be unescaped into a third copy.
    The text grows by ``+=`` on a name nothing else refers to, which CPython does in
    place where the allocator can; each row is let go before the text grows, so the
    space it took after the text is free to grow into (held, it makes the allocator
    move the whole text, a copy beside the original)."""
    cursor: CursorWrapper = context["cursor"]
    decoder = codecs.getincrementaldecoder("utf-8")()
    text = ""
    plain: bool | None = None
    with psycopg.Cursor(cursor.cursor.connection) as binary:
        for row in binary.stream(sql, params, binary=True):
            plain, data = row
            del row
            piece = decoder.decode(data)
            del data
            text += piece
            del piece
    if plain is None:
        return None
    text += decoder.decode(b"", final=True)
    return plain, text


class ParentPages:
    """The values of a node's parents, in position order, read a page at a time on
    ``alias``; the last page read is kept (indexing near it reads nothing)."""

    def __init__(self, alias: str, parents: Sequence[Parent]):
        self.alias = alias
        self.parents = tuple(parents)
        self._starts = _page_starts(self.parents)
        self._kept: tuple[int, list[Any]] | None = None  # (page number, its values)

    def __len__(self) -> int:
        return len(self.parents)

    def _page(self, number: int) -> list[Any]:
        if self._kept is not None and self._kept[0] == number:
            return self._kept[1]
        self._kept = None  # let the previous page go before the next is read
        start = self._starts[number]
        end = self._starts[number + 1] if number + 1 < len(self._starts) else len(self.parents)
        values = self._read(self.parents[start:end])
        self._kept = (number, values)
        return values

    def _read(self, parents: Sequence[Parent]) -> list[Any]:
        if len(parents) == 1 and _streamed(parents[0]):
            return [read_streamed(self.alias, parents[0].job_id)]
        ids = [p.job_id for p in parents if p.stored is not None]
        texts: dict[int, Any] = {}
        if ids:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(store.PARENT_RESULT_PAGE, {"ids": ids})
                texts = dict(cursor.fetchall())
        values: list[Any] = []
        for parent in parents:
            if parent.stored is None:
                values.append(None)
            elif parent.job_id in texts:
                values.append(decode(parent.job_id, texts[parent.job_id]))
            else:  # deleted by hand while the job ran
                raise _gone(parent.job_id)
        return values

    def at(self, index: int) -> Any:
        number = bisect_right(self._starts, index) - 1
        return self._page(number)[index - self._starts[number]]

    def __iter__(self) -> Iterator[Any]:
        for number in range(len(self._starts)):
            yield from self._page(number)


class ResultList(Sequence[Any]):
    """A chord's results in the group's order, read from the database a page at a
    time as they are used. Behaves as a read-only list: ``len``, indexing and
    slices, iteration, ``==`` with a list; ``list(results)`` makes a real list (and
    holds every result). Each pass reads the results again."""

    __slots__ = ("_pages",)

    def __init__(self, pages: ParentPages):
        self._pages = pages

    def __len__(self) -> int:
        return len(self._pages)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._pages.at(i) for i in range(*index.indices(len(self)))]
        position = operator.index(index)
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError("chord result index out of range")
        return self._pages.at(position)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._pages)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResultList | list | tuple):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))  # a copy that leaves the database behind

    def __repr__(self) -> str:
        return f"<ResultList of {len(self)} results, read as used>"


class ParentResults(Mapping[str, Any]):
    """``context.parent_results``: each parent node's name -> its result, read from
    the database when asked for (a page at a time). Behaves as a read-only dict:
    ``len``, ``in``, iteration over the names in the parents' order (no value is
    read), ``[name]``, ``.get``, ``.items()``, ``==`` with a dict; ``dict(...)``
    makes a real dict (and holds every result)."""

    __slots__ = ("_index", "_pages")

    def __init__(self, pages: ParentPages):
        self._pages = pages
        # a name given twice maps to its last parent, as a dict built in order would
        self._index = {parent.name: i for i, parent in enumerate(pages.parents)}

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> Any:
        return self._pages.at(self._index[name])

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self.items()),))

    def __repr__(self) -> str:
        names = list(self._index)
        shown = ", ".join(repr(n) for n in names[:5]) + (", ..." if len(names) > 5 else "")
        return f"<ParentResults of {len(names)} parents: {shown}>"
