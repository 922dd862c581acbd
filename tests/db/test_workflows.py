"""Workflows (docs/reference/workflows.md): building, validating and enqueueing graphs,
and running them
with ``testing.run_jobs()`` (the release, the results, cancels and resumes that the
database does in the transaction of each parent's move)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

import django_pgjobs
from django_pgjobs import Workflow, WorkflowRun, chain, chord, group
from django_pgjobs.models import Job, JobDependency
from django_pgjobs.models import Workflow as WorkflowRow
from django_pgjobs.testing import run_jobs
from django_pgjobs.workflows import Signature, WorkflowConflict, cancel_workflow, workflow_graph
from tests import flow_keyed_jobs
from tests import workflow_jobs as w

pytestmark = pytest.mark.django_db


def status(job: Job) -> str:
    return Job.objects.get(id=job.id).status


def statuses(run: WorkflowRun) -> list[str]:
    rows = dict(Job.objects.filter(workflow_id=run.id).values_list("id", "status"))
    return [rows[j.id] for j in run.jobs]


def ran(results: list[Any]) -> list[tuple[str, str, Any]]:
    return [(r.task.rsplit(".", 1)[-1], r.status, r.value) for r in results]


# -- the public names ----------------------------------------------------------------


def test_public_names() -> None:
    for name in ("Workflow", "WorkflowRun", "Signature", "batch", "chain", "chord", "group"):
        assert name in django_pgjobs.__all__
        assert getattr(django_pgjobs, name) is not None
    sig = w.double.s(2)
    assert isinstance(sig, Signature) and not sig.immutable and sig.args == [2]
    assert w.double.si(2).immutable
    assert w.double.using(queue="q", priority=3).s(1).options == {"queue": "q", "priority": 3}
    assert repr(w.store.s(["a"], prefix="p")) == "tests.workflow_jobs.store.s(['a'], prefix='p')"


# -- building: bad input gets a clear error and writes nothing ------------------------


def test_signature_arguments_are_checked_when_built() -> None:
    with pytest.raises(TypeError, match=r"double.s\(\): argument #0 is a .*set"):
        w.double.s({1, 2})
    with pytest.raises(TypeError, match=r"fetch.si\(\): argument 'url' .*NUL"):
        w.fetch.si(url="a\x00b")
    with pytest.raises(ValueError, match="MAX_ARGS_BYTES"):
        w.constant.s("x" * 2_000_000)
    with pytest.raises(TypeError, match="unknown option 'quue'"):
        w.double.using(quue="x")


def test_arity_is_checked_when_placed() -> None:
    wf = Workflow("arity")
    with pytest.raises(TypeError, match=r"node 0 .*missing a required argument: 'x'"):
        wf.add(w.double.s())
    a = wf.add(w.fetch.s("u"))
    # in a chain, parse gets fetch's result first: parse.s() fits, parse.s(x) does not
    with pytest.raises(TypeError, match=r"too many positional arguments.*\.si\(\.\.\.\)"):
        chain(w.fetch.s("u"), w.parse.s({"body": "b"})).enqueue()
    chain(w.fetch.s("u"), w.parse.s())  # fits
    # in a workflow a node gets no argument from its parents (context.parent_results)
    with pytest.raises(TypeError, match="missing a required argument: 'page'"):
        wf.add(w.parse.s(), after=[a])
    assert len(wf.nodes) == 1
    assert not Job.objects.exists()


def test_graph_errors_name_the_problem() -> None:
    wf = Workflow("checks")
    a = wf.add(w.double.s(1), name="a")
    other = Workflow("other")
    stranger = other.add(w.double.s(1))
    with pytest.raises(ValueError, match="already has a node named 'a'"):
        wf.add(w.double.s(2), name="a")
    with pytest.raises(ValueError, match=r"a node of another workflow \('other'\)"):
        wf.add(w.double.s(2), after=[stranger])
    with pytest.raises(ValueError, match=r"lists .* twice"):
        wf.add(w.double.s(2), after=[a, a])
    with pytest.raises(ValueError, match='on_parent_failure must be "cancel" or "run"'):
        wf.add(w.double.s(2), after=[a], on_parent_failure="ignore")
    with pytest.raises(TypeError, match="must list nodes returned by add"):
        wf.add(w.double.s(2), after=["a"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a workflow node is a signature"):
        wf.add(w.double)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty string"):
        Workflow("")
    with pytest.raises(ValueError, match="NUL"):
        wf.add(w.double.s(2), name="x\x00")
    with pytest.raises(ValueError, match="has no nodes"):
        Workflow("empty").enqueue()
    with pytest.raises(ValueError, match="at least one"):
        group([])
    with pytest.raises(TypeError, match="take signatures"):
        chain(w.double.s(1), "nope").enqueue()
    assert len(wf.nodes) == 1 and not Job.objects.exists()


def test_a_cycle_cannot_be_built_and_is_refused_if_forged() -> None:
    """``after`` names nodes added before: there is no way to write a cycle. A graph
    forged by hand (a node whose parent comes after it) is refused at enqueue."""
    wf = Workflow("cycle")
    a = wf.add(w.double.s(1))
    b = wf.add(w.double.s(2), after=[a])
    object.__setattr__(a, "parents", (b,))
    with pytest.raises(ValueError, match="has a cycle through"):
        wf.enqueue()
    assert not Job.objects.exists() and not WorkflowRow.objects.exists()


# -- enqueue -----------------------------------------------------------------------


def test_enqueue_writes_nodes_edges_and_run_in_order() -> None:
    wf = Workflow("import-feed")
    a = wf.add(w.fetch.s("http://x"), name="fetch")
    b = wf.add(w.report_parents.s("b"), after=[a], name="parse")
    c = wf.add(w.report_parents.s("c"), after=[a, b], on_parent_failure="run")
    run = wf.enqueue()
    assert isinstance(run, WorkflowRun) and run.name == "import-feed" and run.kind == "workflow"
    assert [j.task for j in run.jobs] == [
        w.fetch.name,
        w.report_parents.name,
        w.report_parents.name,
    ]
    assert [j.status for j in run.jobs] == ["pending", "blocked", "blocked"]
    assert run.jobs[0].id < run.jobs[1].id < run.jobs[2].id
    for job in run.jobs:  # what enqueue returned is what the table holds
        row = Job.objects.get(id=job.id)
        for field in ("status", "workflow_id", "node", "waiting", "failed_parents", "run_at"):
            assert getattr(row, field) == getattr(job, field), field
    assert [(j.node, j.waiting, j.failed_parents) for j in run.jobs] == [
        ("fetch", 0, None),
        ("parse", 1, 0),
        (None, 2, 0),
    ]
    edges = list(
        JobDependency.objects.order_by("child_id", "position").values_list(
            "child_id", "position", "parent_id", "parent_node", "on_parent_failure", "receives"
        )
    )
    ids = [j.id for j in run.jobs]
    assert edges == [
        (ids[1], 0, ids[0], "fetch", "cancel", "none"),
        (ids[2], 0, ids[0], "fetch", "run", "none"),
        (ids[2], 1, ids[1], "parse", "run", "none"),
    ]
    assert WorkflowRow.objects.get(id=run.id).kind == "workflow"
    assert (a.name, b.name, c.name) == ("fetch", "parse", None)


def test_enqueue_joins_the_callers_transaction() -> None:
    with transaction.atomic():
        run = chain(w.double.s(1), w.double.s()).enqueue()
        assert Job.objects.filter(workflow_id=run.id).count() == 2
        transaction.set_rollback(True)
    assert not Job.objects.exists() and not WorkflowRow.objects.exists()
    assert not JobDependency.objects.exists()


def test_a_taken_key_refuses_the_whole_workflow() -> None:
    w.double.using(idempotency_key="k1").enqueue(5)
    with transaction.atomic():
        w.constant.enqueue("outside")
        wf = Workflow("keyed")
        wf.add(w.double.s(1))
        wf.add(w.double.using(idempotency_key="k1").s(2))
        with pytest.raises(WorkflowConflict, match="idempotency key 'k1' already exists"):
            wf.enqueue()
        # the caller's transaction goes on: its own job stays, nothing of the workflow
        assert Job.objects.count() == 2
    assert not Job.objects.filter(workflow_id__isnull=False).exists()
    assert not JobDependency.objects.exists()


def test_unique_while_node_holds_its_key_while_blocked() -> None:
    run = chain(w.double.s(1), w.unique_step.si("k")).enqueue()
    blocked = run.jobs[1]
    assert blocked.status == "blocked" and blocked.unique_key is not None
    # a second enqueue of the key, while the node waits, returns the node
    assert w.unique_step.enqueue("k").id == blocked.id
    with pytest.raises(WorkflowConflict, match="unique key"):
        chain(w.double.s(1), w.unique_step.si("k")).enqueue()
    assert ran(run_jobs()) == [("double", "completed", 2), ("unique_step", "completed", "k")]
    assert w.unique_step.enqueue("k").id != blocked.id  # finished: the key is free


def test_options_of_each_node_apply() -> None:
    run = chain(
        w.double.using(priority=9, max_attempts=2, timeout=5, delay=timedelta(hours=1)).s(1),
        w.on_other_queue.s(),
    ).enqueue()
    first, second = (Job.objects.get(id=j.id) for j in run.jobs)
    assert (first.priority, first.max_attempts, first.timeout, first.queue) == (
        9,
        2,
        5.0,
        "default",
    )
    assert first.run_at > first.created_at + timedelta(minutes=59)
    assert (second.queue, second.priority) == ("wf-other", 7)
    keyed = chain(w.double.s(1), flow_keyed_jobs.keyed_step.si(group="g1")).enqueue()
    row = Job.objects.get(id=keyed.jobs[1].id)
    assert (row.concurrency_key, row.concurrency_limit) == ("wf:g1", 1)


# -- running: release, results, failures ----------------------------------------------


def test_chain_passes_each_result_on() -> None:
    run = chain(w.fetch.s("u"), w.parse.s(), w.store.s(prefix=">")).enqueue()
    assert run.kind == "chain" and run.name.startswith("chain: fetch -> parse -> store")
    assert ran(run_jobs()) == [
        ("fetch", "completed", {"url": "u", "body": "U"}),
        ("parse", "completed", ["U", "1"]),
        ("store", "completed", ">U|1"),
    ]
    assert statuses(run) == ["completed"] * 3


def test_si_receives_no_result() -> None:
    chain(w.double.s(3), w.constant.si("fixed"), w.double.si(10)).enqueue()
    assert ran(run_jobs()) == [
        ("double", "completed", 6),
        ("constant", "completed", "fixed"),
        ("double", "completed", 20),
    ]


def test_chord_callback_gets_results_in_group_order() -> None:
    # priorities make the group run out of order; the list stays in the group's order
    members = [w.double.using(priority=p).s(i) for i, p in enumerate([1, 9, 3, 7, 5])]
    run = chord(group(members), w.constant.s()).enqueue()
    assert run.kind == "chord" and len(run.jobs) == 6
    assert [j.status for j in run.jobs] == ["pending"] * 5 + ["blocked"]
    assert run.jobs[-1].waiting == 5
    results = run_jobs()
    assert [r.value for r in results[:5]] == [2, 6, 8, 4, 0]
    assert ran(results)[-1] == ("constant", "completed", [0, 2, 4, 6, 8])


def test_chord_callback_made_with_si_reads_parent_results() -> None:
    run = chord([w.double.s(1), w.double.s(2)], w.report_parents.si(tag="cb")).enqueue()
    ids = [str(j.id) for j in run.jobs[:2]]
    assert run_jobs()[-1].value == {"tag": "cb", "parents": {ids[0]: 2, ids[1]: 4}}


def test_chord_list_argument() -> None:
    chord([w.double.s(i) for i in range(4)], w.add_up.s(extra=100)).enqueue()
    assert ran(run_jobs())[-1] == ("add_up", "completed", 112)


def test_parent_results_are_named() -> None:
    wf = Workflow("names")
    a = wf.add(w.constant.s({"x": 1}), name="first")
    b = wf.add(w.constant.s([1, 2]))
    wf.add(w.report_parents.s("c"), after=[a, b])
    run = wf.enqueue()
    last = run_jobs()[-1]
    assert last.value == {"tag": "c", "parents": {"first": {"x": 1}, str(run.jobs[1].id): [1, 2]}}


def test_a_name_of_digits_is_refused_so_no_parent_result_is_lost() -> None:
    """An unnamed parent's key in parent_results is its job id as a string: a sibling
    named like a job id would take its place (one parent's result lost)."""
    wf = Workflow("digits")
    unnamed = wf.add(w.constant.s(1))
    for name in ("7", "0042"):
        with pytest.raises(ValueError, match=rf"name '{name}': .* cannot be all digits"):
            wf.add(w.constant.s(2), name=name)
    assert len(wf.nodes) == 1
    named = wf.add(w.constant.s(2), name="7a")
    wf.add(w.report_parents.s(), after=[unnamed, named], name="\u0667")  # never a job id
    run = wf.enqueue()
    assert len(run.jobs) == 3
    last = run_jobs()[-1]
    assert last.value["parents"] == {str(run.jobs[0].id): 1, "7a": 2}


def test_a_blocked_job_is_never_claimed() -> None:
    run = chain(w.wait_for_file.s("/nonexistent", 0.0), w.double.si(1)).enqueue()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE django_pgjobs_job SET run_at = now() - interval '1 hour'")
    results = run_jobs()
    assert ran(results)[0][:2] == ("wait_for_file", "pending")  # failed once, backing off
    assert status(run.jobs[1]) == "blocked"
    assert Job.objects.pending().filter(id=run.jobs[1].id).count() == 0


def test_a_dead_parent_cancels_dependents_and_says_which() -> None:
    wf = Workflow("fail")
    a = wf.add(w.explode.s("kaput"), name="a")
    b = wf.add(w.double.si(1), after=[a], name="b")
    c = wf.add(w.double.si(2), after=[b], name="c")  # cancelled through b
    d = wf.add(w.report_parents.s("d"), after=[a], on_parent_failure="run", name="d")
    wf.add(w.double.si(3), after=[d])  # d runs, so this one does too
    run = wf.enqueue()
    assert (b.name, c.name) == ("b", "c")
    results = run_jobs()
    assert ran(results) == [
        ("explode", "dead", None),
        ("report_parents", "completed", {"tag": "d", "parents": {"a": None}}),
        ("double", "completed", 6),
    ]
    rows = {j.node: Job.objects.get(id=j.id) for j in run.jobs}
    assert rows["b"].status == "cancelled" and rows["b"].cancelled_by == rows["a"].id
    assert rows["b"].last_error == (
        f'cancelled: its parent job #{rows["a"].id} (a) ended dead (on_parent_failure="cancel")'
    )
    assert rows["c"].status == "cancelled" and rows["c"].cancelled_by == rows["b"].id
    assert "(b) ended cancelled" in rows["c"].last_error
    assert rows["d"].failed_parents == 1


def test_a_long_chain_cancels_without_recursion() -> None:
    """Cancelling 600 chained nodes is a loop in one statement's trigger, not 600
    nested triggers (which would exhaust the server's stack)."""
    run = chain(w.explode.s(), *[w.double.si(i) for i in range(600)]).enqueue()
    assert ran(run_jobs()) == [("explode", "dead", None)]
    counts = Job.objects.filter(workflow_id=run.id, status="cancelled").count()
    assert counts == 600


def test_retrying_the_failed_node_resumes_its_dependents() -> None:
    run = chain(w.explode.s(), w.double.si(4), w.double.s()).enqueue()
    run_jobs()
    assert statuses(run) == ["dead", "cancelled", "cancelled"]
    assert Job.objects.filter(id=run.jobs[0].id).retry() == 1
    assert statuses(run) == ["pending", "blocked", "blocked"]
    second = Job.objects.get(id=run.jobs[1].id)
    assert (second.waiting, second.failed_parents, second.cancelled_by) == (1, 0, None)
    assert second.last_error is None and second.finished_at is None
    # it fails again (explode always does): the dependents are cancelled again
    run_jobs()
    assert statuses(run) == ["dead", "cancelled", "cancelled"]


def test_retry_of_a_cancelled_node_with_unfinished_parents_waits_again() -> None:
    run = chain(w.wait_for_file.s("/nonexistent", 0.0), w.double.si(1)).enqueue()
    Job.objects.filter(id=run.jobs[1].id).cancel()
    assert statuses(run) == ["pending", "cancelled"]
    assert Job.objects.filter(id=run.jobs[1].id).retry() == 1
    assert statuses(run) == ["pending", "blocked"]


def test_cancel_a_blocked_node_and_its_dependents() -> None:
    run = chain(w.double.s(1), w.double.s(), w.double.s()).enqueue()
    assert Job.objects.filter(id=run.jobs[1].id).cancel() == 1
    assert statuses(run) == ["pending", "cancelled", "cancelled"]
    assert ran(run_jobs()) == [("double", "completed", 2)]


def test_cancel_the_workflow() -> None:
    run = chain(w.double.s(1), w.double.s(), w.double.s()).enqueue()
    run_jobs(max_jobs=1)
    assert run.cancel() == 2
    assert statuses(run) == ["completed", "cancelled", "cancelled"]
    assert WorkflowRow.objects.get(id=run.id).cancelled_at is not None
    assert cancel_workflow(run.id) == 0
    assert run_jobs() == []


def test_the_graph_seam() -> None:
    run = chord([w.double.s(1), w.double.s(2)], w.add_up.s()).enqueue()
    graph = workflow_graph(run.id)
    assert [(n.id, n.status) for n in graph.nodes] == [
        (run.jobs[0].id, "pending"),
        (run.jobs[1].id, "pending"),
        (run.jobs[2].id, "blocked"),
    ]
    assert [(e.parent, e.child, e.position) for e in graph.edges] == [
        (run.jobs[0].id, run.jobs[2].id, 0),
        (run.jobs[1].id, run.jobs[2].id, 1),
    ]
    assert not graph.truncated and run.graph(limit=2).truncated


def test_nested_canvas() -> None:
    """chain(a, group(b, c), d): b and c get a's result; d gets [b's, c's]."""
    run = chain(
        w.double.s(1),
        group(w.double.s(), chain(w.double.s(), w.double.s())),
        w.add_up.s(),
    ).enqueue()
    assert ran(run_jobs())[-1] == ("add_up", "completed", 4 + 8)
    assert run.kind == "chain" and len(run.jobs) == 5


def test_async_job_and_nodes_on_different_queues() -> None:
    chain(w.async_double.s(2), w.on_other_queue.s(), w.async_double.s()).enqueue()
    results = run_jobs()
    assert ran(results) == [
        ("async_double", "completed", 4),
        ("on_other_queue", "completed", 5),
        ("async_double", "completed", 10),
    ]


def test_run_jobs_of_one_queue_leaves_the_others_waiting() -> None:
    run = chain(w.double.s(1), w.on_other_queue.s(), w.double.s()).enqueue()
    assert ran(run_jobs(queues=["default"])) == [("double", "completed", 2)]
    assert statuses(run) == ["completed", "pending", "blocked"]
    assert ran(run_jobs(queues=["wf-other"])) == [("on_other_queue", "completed", 3)]
    assert ran(run_jobs()) == [("double", "completed", 6)]


def test_a_node_that_times_out_counts_as_failed() -> None:
    """The worker gives up on a run past its timeout (written like any failure): its
    dependents are cancelled; with "run" they run anyway."""
    from django_pgjobs import claim
    from django_pgjobs.db.job_outcome import job_timed_out
    from django_pgjobs.worker.executor import timed_out

    wf = Workflow("timeouts")
    slow = wf.add(w.too_slow.s(5.0))
    after = wf.add(w.double.si(1), after=[slow])
    anyway = wf.add(w.double.si(2), after=[slow], on_parent_failure="run")
    run = wf.enqueue()
    (claimed,) = claim.claim(connection, worker="w", queues=None, n=1)
    outcome = timed_out(claimed, 0.3, "w")
    assert outcome.kind == "dead"  # max_attempts=1
    assert job_timed_out(
        connection, id=claimed.id, lease=claimed.lease, retry=False, delay=0, error=outcome.error
    )
    assert statuses(run) == ["dead", "cancelled", "pending"]
    assert (after.name, anyway.name) == (None, None)


def test_a_node_on_a_paused_queue_waits_like_any_job() -> None:
    from django_pgjobs import pause_queue, resume_queue

    pause_queue("wf-other")
    run = chain(w.double.s(1), w.on_other_queue.s(), w.double.s()).enqueue()
    assert ran(run_jobs()) == [("double", "completed", 2)]
    assert statuses(run) == ["completed", "pending", "blocked"]
    resume_queue("wf-other")
    assert ran(run_jobs()) == [("on_other_queue", "completed", 3), ("double", "completed", 6)]


def test_hostile_names_and_values_are_stored_as_given() -> None:
    wf = Workflow("<b>feed</b> 'x' \u202e")
    a = wf.add(w.constant.s({"k": "\u2028<script>"}), name="<script>alert(1)</script>")
    wf.add(w.report_parents.s("c"), after=[a])
    run = wf.enqueue()
    assert WorkflowRow.objects.get(id=run.id).name == "<b>feed</b> 'x' \u202e"
    last = run_jobs()[-1]
    assert last.value["parents"] == {"<script>alert(1)</script>": {"k": "\u2028<script>"}}
    with pytest.raises(ValueError, match="at most 255"):
        wf.add(w.double.s(1), name="n" * 256)


def test_an_undecodable_parent_result_fails_the_child_alone() -> None:
    """A parent's stored result psql made undecodable dead-letters
    the child that reads it, with the reason; the worker and other jobs go on."""
    run = chain(w.double.s(1), w.double.using(max_attempts=1).s()).enqueue()
    parent, child = Job.objects.filter(workflow_id=run.id).order_by("id")
    other = w.double.enqueue(5)
    with connection.cursor() as cursor:  # the child is not due until the result is spoiled
        cursor.execute(
            "UPDATE django_pgjobs_job SET run_at = now() + interval '1 hour' WHERE id = %s",
            [child.id],
        )
    run_jobs()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_pgjobs_jobresult SET value = (repeat('[', 3000) || repeat(']', 3000))"
            "::jsonb WHERE job_id = %s",
            [parent.id],
        )
        cursor.execute("UPDATE django_pgjobs_job SET run_at = now() WHERE id = %s", [child.id])
    run_jobs()
    statuses = dict(Job.objects.values_list("id", "status"))
    assert statuses[parent.id] == "completed" and statuses[other.id] == "completed"
    child.refresh_from_db()
    assert child.status == "dead", (child.status, child.last_error)
    assert f"stored result of parent job {parent.id} cannot be decoded" in child.last_error
