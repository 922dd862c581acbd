"""A node's parents' results read as the handler uses them, a bounded page at a
time (``workflows/result_pages.py``): a chord callback that walks every result holds
about one at a time, and the list and mapping it is given behave as before."""

from __future__ import annotations

import random
import sys
import tracemalloc
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from django.db import connection

from django_pgjobs import chord
from django_pgjobs.db import store
from django_pgjobs.testing import run_jobs
from django_pgjobs.workflows.result_pages import (
    PAGE_BYTES,
    PAGE_ROWS,
    PIECE_BYTES,
    Parent,
    _page_starts,
)
from tests import workflow_jobs as w

pytestmark = pytest.mark.django_db

MEMBERS = 200
SIZE = 512 * 1024


def traced() -> int:
    """Under a tracer (coverage) CPython does not grow a string in place: each piece
    copies the value read so far, so for a moment the value is there twice."""
    return SIZE if sys.gettrace() is not None else 0


def run_callback(callback: Any) -> tuple[list[Any], int]:
    """Runs a chord of ``MEMBERS`` results of ``SIZE`` and then its ``callback``; the
    callback's runs and Python's peak allocation while it ran."""
    members = [w.blob.s(SIZE, i) for i in range(MEMBERS)]
    chord(members, callback.using(queue="wf-memory").s()).enqueue()
    assert len(run_jobs(queues=["default"])) == MEMBERS
    tracemalloc.start()
    try:
        ran = run_jobs(queues=["wf-memory"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return ran, peak


def test_a_chord_callback_walking_its_results_holds_a_few_at_a_time() -> None:
    """200 results of 512 kB (100 MB): the callback reads each through the list and
    through ``parent_results``; Python's peak allocation while it runs stays within a
    few results (it held all of them, twice over, when they were read at once)."""
    ran, peak = run_callback(w.walk_results)
    assert [r.status for r in ran] == ["completed"]
    assert ran[0].value == {"heads": [str(i) for i in range(MEMBERS)], "size": MEMBERS * SIZE}
    # the current result, the previous one (the loop's variable keeps it while the
    # next is read) and a piece: reading each whole first held two more
    assert peak < 2.4 * SIZE + traced(), (
        f"peak {peak / 2**20:.2f} MiB while reading {MEMBERS} results"
    )


def test_a_chord_callback_that_keeps_no_result_holds_one_and_a_piece() -> None:
    """A callback that lets each result go before reading the next (``size_results``)
    holds the one being read and the piece it is growing by; each row of the stream
    is let go before the value grows, so no row's copy of a piece is held beside it."""
    ran, peak = run_callback(w.size_results)
    assert [(r.status, r.value) for r in ran] == [("completed", MEMBERS * SIZE)]
    # the result, the piece it grows by and the run's own few kB: holding each row
    # while the value grew held one more piece
    assert peak < 1.35 * SIZE + traced(), (
        f"peak {peak / 2**20:.2f} MiB while reading {MEMBERS} results"
    )


def test_a_result_larger_than_a_page_is_read_in_pieces_as_it_was_returned() -> None:
    """A string with multi-byte characters (a piece may end inside one), quotes and
    escapes, and a nested value, each larger than a page: streamed in pieces through
    the connection's execute wrappers (one statement each), decoded as returned."""
    rng = random.Random(7)
    text = "".join(rng.choice('aé€😀"\\\n') for _ in range(190_000))
    nested = {"k": [text[i : i + 1000] for i in range(0, len(text), 1000)], "n": [1, 2.5, None]}
    assert len(text.encode()) > PAGE_BYTES + PIECE_BYTES
    run = chord([w.constant.s(text), w.constant.s(nested)], w.digest.s()).enqueue()
    assert len(run_jobs(queues=["default"], max_jobs=2)) == 2
    seen: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        ran = run_jobs()
    assert [(r.id, r.status) for r in ran] == [(run.jobs[-1].id, "completed")]
    assert ran[0].value == w.digest_of([text, nested])
    assert seen.count(store.PARENT_RESULT_PIECES) == 2


def test_the_list_and_the_mapping_behave_as_a_list_and_a_dict() -> None:
    """Results over several pages (random ones read in pairs, compressed ones alone),
    a parent with no result and a small one: every way of reading them gives the
    values in the group's order, and a callback may return them nested."""
    members = [w.blob.s(100_000, i, packed=i % 3 == 0) for i in range(8)]
    members += [w.constant.s(None), w.constant.s({"k": [1, 2]})]
    run = chord(members, w.probe_results.s()).enqueue()
    ran = run_jobs()
    assert [r.status for r in ran] == ["completed"] * 11, [r.error for r in ran]
    by_id = {r.id: w._head(r.value) for r in ran}
    expected = [by_id[j.id] for j in run.jobs[:-1]]
    names = [str(j.id) for j in run.jobs[:-1]]
    assert expected[0].startswith("0:") and expected[8] is None
    seen = ran[-1].value
    assert seen["len"] == 10
    assert seen["list"] == expected and seen["again"] == expected
    assert seen["reversed"] == expected[::-1]
    assert seen["index"] == [expected[0], expected[-1], expected[5]]
    assert seen["slice"] == expected[1:4]
    assert seen["eq"] is True and seen["in"] is True and seen["pickled"] is True
    assert seen["names"] == names
    assert seen["by_name"] == expected
    assert seen["items"] == dict(zip(names, expected, strict=True))
    assert seen["get"] == [expected[0], "none"]
    assert seen["has"] == [True, False]


def test_a_callback_may_return_what_it_was_given() -> None:
    from django_pgjobs.workflows import ParentResults, ResultList

    assert issubclass(ResultList, Sequence) and issubclass(ParentResults, Mapping)
    run = chord([w.double.s(1), w.double.s(2)], w.collect.s()).enqueue()
    ids = [str(j.id) for j in run.jobs[:2]]
    assert run_jobs()[-1].value == {
        "type": "ResultList",
        "values": [2, 4],
        "parents": {ids[0]: 2, ids[1]: 4},
    }


def test_an_async_callback_gets_a_plain_list() -> None:
    """An async handler runs on an event loop, where no query may wait: its results
    are read before it starts, as a list."""
    chord([w.double.s(1), w.double.s(2)], w.async_collect.s()).enqueue()
    assert run_jobs()[-1].value == {"type": "list", "values": [2, 4]}


def parents(*sizes: int | None, packed: frozenset[int] = frozenset()) -> list[Parent]:
    return [Parent(i, str(i), size, i in packed) for i, size in enumerate(sizes)]


def test_pages_are_bounded_by_stored_bytes_and_rows() -> None:
    half = PAGE_BYTES // 2
    assert _page_starts([]) == []
    assert _page_starts(parents(half, half, half, None, 10)) == [0, 2]
    assert _page_starts(parents(3 * PAGE_BYTES, 1, 1)) == [0, 1]  # a large one alone
    assert _page_starts(parents(1, 5, 1, 1, packed=frozenset({1}))) == [0, 1, 2]
    assert _page_starts(parents(*[None] * (PAGE_ROWS + 1))) == [0, PAGE_ROWS]


def test_a_chord_of_small_results_keeps_its_order(django_assert_max_num_queries: Any) -> None:
    """Small results are read many to a statement, not one by one."""
    chord([w.double.s(i) for i in range(40)], w.add_up.using(queue="wf-sum").s()).enqueue()
    run_jobs(queues=["default"])
    # run_jobs' own statements besides the reads: its claims, the fair queues' look
    # (once a call) and, once nothing is left to claim, the look for waiting durable
    # jobs now due
    with django_assert_max_num_queries(13):
        assert run_jobs(queues=["wf-sum"])[-1].value == 2 * sum(range(40))


def test_a_result_deleted_while_the_callback_runs_fails_it_naming_the_parent() -> None:
    run = chord([w.double.s(1), w.double.s(2)], w.read_after_delete.s()).enqueue()
    ran = run_jobs()[-1]
    assert ran.status == "dead"
    assert ran.error is not None
    assert f"parent job {run.jobs[0].id} is gone" in ran.error["message"], ran.error
