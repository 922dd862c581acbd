"""The workflow admin: the run's graph, the list's progress, retrying
a run's failed nodes (their dependents resume) and cancelling a run from its page."""

from __future__ import annotations

import re
import statistics
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs import Workflow, chain
from django_pgjobs.admin.workflow_graph import PER_LAYER, layout
from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from django_pgjobs.workflows.runs import Progress, Sample
from tests import workflow_jobs as w

pytestmark = pytest.mark.django_db


def run_page(client: Client, run_id: int) -> str:
    response = client.get(reverse("admin:django_pgjobs_workflow_change", args=[run_id]))
    assert response.status_code == 200
    return response.content.decode()


def graph_of(text: str) -> str:
    start = text.index('<svg id="pgjobs-graph"')
    return text[start : text.index("</svg>", start)]


def nodes_in(text: str) -> dict[int, str]:
    """The drawn nodes of the page's graph: job id -> status."""
    return {
        int(i): s
        for i, s in re.findall(
            r'class="pgjobs-node" href="[^"]*" data-id="(\d+)" data-status="(\w+)"', text
        )
    }


def diamond() -> Workflow:
    wf = Workflow("diamond")
    a = wf.add(w.double.s(1), name="a")
    b = wf.add(w.double.si(2), after=[a], name="b")
    c = wf.add(w.explode.si(), after=[a], name="c")
    wf.add(w.double.si(3), after=[b, c], name="d")
    return wf


def test_the_run_page_draws_every_node_by_status_with_a_link_to_its_job(
    admin_client: Client,
) -> None:
    run = diamond().enqueue()
    run_jobs()
    a, b, c, d = (Job.objects.get(id=j.id) for j in run.jobs)
    assert (a.status, b.status, c.status, d.status) == (
        "completed",
        "completed",
        "dead",
        "cancelled",
    )
    text = run_page(admin_client, run.id)
    assert nodes_in(text) == {a.id: "completed", b.id: "completed", c.id: "dead", d.id: "cancelled"}
    for job in (a, b, c, d):
        assert f'href="{reverse("admin:django_pgjobs_job_change", args=[job.id])}"' in text
    assert "3 / 4 done" not in text and "4 / 4 done" in text
    assert graph_of(text).count("<path d=") == 4, "a->b, a->c, b->d, c->d"
    # layered: a in column 0, b and c in column 1, d in column 2 (x grows by column)
    xs = {
        int(i): float(x)
        for i, x in re.findall(r'data-id="(\d+)"[^>]*><title>[^<]*</title><rect x="([\d.]+)"', text)
    }
    assert xs[a.id] < xs[b.id] == xs[c.id] < xs[d.id]
    # the job page links back to its run
    job_page = admin_client.get(reverse("admin:django_pgjobs_job_change", args=[d.id]))
    assert (
        reverse("admin:django_pgjobs_workflow_change", args=[run.id]) in job_page.content.decode()
    )


def test_the_list_shows_each_runs_progress_in_one_query(admin_client: Client) -> None:
    done = chain(w.double.s(1), w.double.s()).enqueue()
    run_jobs()
    waiting = chain(w.double.s(1), w.double.s(), w.double.s()).enqueue()
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse("admin:django_pgjobs_workflow_changelist"))
    text = response.content.decode()
    assert 'data-done="2" data-total="2"' in text and "2 / 2 done" in text
    assert 'data-done="0" data-total="3"' in text
    assert sum("django_pgjobs_job" in q["sql"] for q in queries.captured_queries) == 1
    assert done.id != waiting.id


def test_retry_failed_nodes_resumes_the_dependents_they_cancelled(admin_client: Client) -> None:
    run = diamond().enqueue()
    run_jobs()
    _, _, c, d = run.jobs
    assert Job.objects.get(id=d.id).cancelled_by == c.id
    # c would fail again when rerun: make it succeed this time
    Job.objects.filter(id=c.id).update(task=w.double.definition.name, args=[5])
    response = admin_client.post(
        reverse("admin:django_pgjobs_workflow_changelist"),
        {"action": "retry_failed_runs", "_selected_action": [run.id]},
        follow=True,
    )
    assert "Retried 1 failed node(s)." in response.content.decode()
    assert Job.objects.get(id=c.id).status == "pending"
    assert Job.objects.get(id=d.id).status == "blocked", "resumed: waits for c again"
    run_jobs()
    assert Job.objects.get(id=d.id).status == "completed"
    assert "4 / 4 done" in run_page(admin_client, run.id)


def test_a_failed_node_below_a_failed_node_waits_for_the_next_retry() -> None:
    """A chain a -> b -> c whose a died: retrying resumes b and c; rerun, b dies too;
    retry_failed then retries b (its parent completed) and c resumes."""
    run = chain(w.explode.si(), w.explode.si(), w.double.si(1)).enqueue()
    run_jobs()
    a, b, c = (j.id for j in run.jobs)
    assert Job.objects.get(id=a).status == "dead"
    assert Job.objects.get(id=b).cancelled_by == a
    Job.objects.filter(id=a).update(task=w.double.name, args=[1])
    assert run.retry_failed() == 1
    assert Job.objects.get(id=b).status == "blocked" and Job.objects.get(id=c).status == "blocked"
    run_jobs()
    assert [Job.objects.get(id=i).status for i in (a, b, c)] == ["completed", "dead", "cancelled"]
    Job.objects.filter(id=b).update(task=w.double.name, args=[2])
    assert run.retry_failed() == 1
    run_jobs()
    assert [Job.objects.get(id=i).status for i in (a, b, c)] == ["completed"] * 3


def test_a_cancelled_run_is_not_retried_and_says_why(admin_client: Client) -> None:
    run = chain(w.double.s(1), w.double.s()).enqueue()
    text = run_page(admin_client, run.id)
    assert 'id="pgjobs-cancel-run"' in text and 'id="pgjobs-retry-failed"' not in text
    # the page's own button posts the changelist action
    admin_client.post(
        reverse("admin:django_pgjobs_workflow_changelist"),
        {"action": "cancel_runs", "_selected_action": [run.id]},
    )
    assert set(Job.objects.filter(workflow_id=run.id).values_list("status", flat=True)) == {
        "cancelled"
    }
    text = run_page(admin_client, run.id)
    assert 'id="pgjobs-cancel-run"' not in text
    response = admin_client.post(
        reverse("admin:django_pgjobs_workflow_changelist"),
        {"action": "retry_failed_runs", "_selected_action": [run.id]},
        follow=True,
    )
    assert f"run(s) #{run.id} were cancelled" in response.content.decode()
    assert Job.objects.filter(workflow_id=run.id, status="cancelled").count() == 2


def test_a_wide_layer_draws_its_first_nodes_and_counts_the_rest() -> None:
    members = [(i, str(i), "t", "completed" if i % 2 else "pending") for i in range(1, 101)]
    nodes = [*members, (101, "cb", "t", "blocked")]
    edges = [(i, 101) for i in range(1, 101)]
    boxes, drawn_edges = layout(Sample(nodes, edges, True, False), Progress({}))
    first = [b for b in boxes if b.col == 0]
    assert len(first) == PER_LAYER + 1
    more = first[-1]
    assert more.kind == "more" and sum(more.counts.values()) == 100 - PER_LAYER
    assert len(drawn_edges) == PER_LAYER + 1, "the rest of the layer is one edge"
    assert [b.col for b in boxes if b.node and b.node[0] == 101] == [1]


def test_a_run_larger_than_the_sample_has_a_gap_box_between_head_and_tail() -> None:
    # a chain of 5 read as head (1, 2) and tail (5): 3 and 4 not read
    nodes = [(1, "1", "t", "completed"), (2, "2", "t", "completed"), (5, "5", "t", "blocked")]
    edges = [(1, 2), (4, 5)]
    boxes, _ = layout(
        Sample(nodes, edges, False, False),
        Progress({"completed": 2, "running": 1, "blocked": 2}),
        head_size=2,
    )
    cols = {(b.node[0] if b.node else b.kind): b.col for b in boxes}
    assert cols == {1: 0, 2: 1, "gap": 2, 5: 3}
    gap = next(b for b in boxes if b.kind == "gap")
    assert dict(gap.counts) == {"running": 1, "blocked": 1}


def test_a_1000_node_run_renders_fast_in_a_bounded_number_of_queries(
    admin_client: Client,
) -> None:
    # 10 layers of 100; each node after the first layer waits for two of the layer before
    wf = Workflow("thousand")
    layers: list[list[object]] = []
    for depth in range(10):
        layer = []
        for i in range(100):
            after = [] if not depth else [layers[-1][i], layers[-1][(i + 1) % 100]]
            layer.append(wf.add(w.double.si(i), after=after))
        layers.append(layer)
    run = wf.enqueue()
    url = reverse("admin:django_pgjobs_workflow_change", args=[run.id])
    admin_client.get(url)  # warm: templates, plans
    timings = []
    for _ in range(5):
        with CaptureQueriesContext(connection) as queries:
            start = time.perf_counter()
            response = admin_client.get(url)
            timings.append(time.perf_counter() - start)
        assert response.status_code == 200
        assert len(queries.captured_queries) <= 10, [q["sql"][:60] for q in queries]
    median = statistics.median(timings)
    print(f"1,000-node run page: median {median * 1000:.0f} ms of {len(timings)}")
    text = response.content.decode()
    assert len(nodes_in(text)) == 10 * PER_LAYER and text.count('class="pgjobs-more"') == 10
    # a box of the rest of a column links to the run's jobs in the job list
    more = re.search(r'class="pgjobs-more" href="([^"]+)"', text)
    assert more is not None
    listing = admin_client.get(more.group(1).replace("&amp;", "&"))
    assert listing.status_code == 200 and "1000 jobs" in listing.content.decode()
    # The time is printed, not asserted: it is tens of milliseconds on a quiet box but
    # seconds on a loaded one (several CI legs on two cores). The bound is the queries.
