"""Operating workflows: the repair pass, blocked counts in jobs_status, metrics and the
admin, the workflow admin (nodes, cancel), and pruning around waiting children."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from django_pgjobs import batch, chain, chord, claim
from django_pgjobs.db.job_outcome import job_complete_many
from django_pgjobs.health import overview
from django_pgjobs.health.metrics import QueueCollector
from django_pgjobs.health.queue_stats import QueueStatsRefresher
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.maintenance.workflow_repair import WorkflowRepair
from django_pgjobs.models import Job, JobDependency, JobResult, Queue
from django_pgjobs.models import Workflow as WorkflowRow
from django_pgjobs.testing import run_jobs
from tests import workflow_jobs as w

pytestmark = pytest.mark.django_db


def execute(statement: str, params: Any = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def without_triggers(action: Any) -> Any:
    """Run ``action`` as a restore or a logical replica would: triggers off."""
    execute("SET session_replication_role = replica")
    try:
        return action()
    finally:
        execute("SET session_replication_role = DEFAULT")


# -- the repair pass ------------------------------------------------------------------


def test_repair_releases_what_a_trigger_never_saw(caplog: Any) -> None:
    run = chain(w.double.s(1), w.double.s()).enqueue()
    (claimed,) = claim.claim(connection, worker="w", queues=None, n=1)
    without_triggers(lambda: job_complete_many(connection, [(claimed.id, claimed.lease, 2)]))
    assert Job.objects.get(id=run.jobs[1].id).status == "blocked"
    result = WorkflowRepair(min_age=0).run_once()
    assert result == {"looked_at": 1, "repaired": 1, "batches": 0, "abandoned": 0}
    assert Job.objects.get(id=run.jobs[1].id).status == "pending"
    assert "disagreed with its parents" in caplog.text
    assert WorkflowRepair(min_age=0).run_once() == {
        "looked_at": 0,
        "repaired": 0,
        "batches": 0,
        "abandoned": 0,
    }


def test_repair_leaves_jobs_blocked_for_less_than_a_minute_to_later_passes() -> None:
    """A young workflow is draining: its recount would hold the callback's row while
    the members' completions wait. A job blocked a minute or more is looked at."""
    run = chain(w.double.s(1), w.double.s()).enqueue()
    (claimed,) = claim.claim(connection, worker="w", queues=None, n=1)
    without_triggers(lambda: job_complete_many(connection, [(claimed.id, claimed.lease, 2)]))
    repair = WorkflowRepair()
    assert repair.min_age == 60.0
    assert repair.run_once() == {"looked_at": 0, "repaired": 0, "batches": 0, "abandoned": 0}
    assert Job.objects.get(id=run.jobs[1].id).status == "blocked"
    Job.objects.filter(id=run.jobs[1].id).update(created_at=Now() - timedelta(seconds=61))
    assert repair.run_once() == {"looked_at": 1, "repaired": 1, "batches": 0, "abandoned": 0}
    assert Job.objects.get(id=run.jobs[1].id).status == "pending"


def test_repair_cancels_after_a_dead_parent_and_counts_deleted_parents_as_gone() -> None:
    run = chain(w.explode.s(), w.double.si(1), w.double.s()).enqueue()
    without_triggers(run_jobs)
    assert [Job.objects.get(id=j.id).status for j in run.jobs] == ["dead", "blocked", "blocked"]
    WorkflowRepair(min_age=0).run_once()  # cancels the first child; the trigger cascades
    assert [Job.objects.get(id=j.id).status for j in run.jobs] == ["dead", "cancelled", "cancelled"]
    gone = chain(w.double.s(1), w.double.si(2)).enqueue()
    Job.objects.filter(id=gone.jobs[0].id).delete()
    WorkflowRepair(min_age=0).run_once()
    assert Job.objects.get(id=gone.jobs[1].id).status == "pending"


def test_repair_fires_a_batch_whose_counts_were_bypassed() -> None:
    with batch(on_complete=w.summarise.s()) as b:
        w.double.enqueue(1)
    without_triggers(run_jobs)
    assert Job.objects.get(node="on_complete").status == "blocked"
    assert WorkflowRepair(min_age=0).run_once()["batches"] == 1
    assert Job.objects.get(node="on_complete").status == "pending"
    assert WorkflowRow.objects.get(id=b.id).completed == 1
    assert run_jobs()[-1].value == {"label": "", "completed": 1, "dead": 0, "cancelled": 0}


def test_repair_walks_the_blocked_jobs_in_batches() -> None:
    for _ in range(5):
        chain(w.double.s(1), w.double.s()).enqueue()
    repair = WorkflowRepair(batch=2, min_age=0)
    assert [repair.run_once()["looked_at"] for _ in range(4)] == [2, 2, 1, 2]


def test_the_worker_runs_the_repair_pass() -> None:
    from django_pgjobs.maintenance.services import default_services

    names = [s.name for s in default_services(alias="default", worker="w")]
    assert "workflow repair" in names


# -- blocked counts -------------------------------------------------------------------


def test_blocked_jobs_are_counted_apart_from_pending(capsys: Any) -> None:
    chord([w.double.s(1), w.double.s(2)], w.add_up.using(queue="wf-cb").s()).enqueue()
    rows = overview.queue_rows(connection, stale_after=30)
    assert (rows["default"].pending, rows["default"].blocked) == (2, 0)
    assert (rows["wf-cb"].pending, rows["wf-cb"].blocked, rows["wf-cb"].due) == (0, 1, 0)
    assert rows["wf-cb"].lag is None
    call_command("jobs_status")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["queue", "pending", "blocked"]
    assert next(line.split() for line in lines if line.startswith("wf-cb"))[:3] == [
        "wf-cb",
        "0",
        "1",
    ]
    call_command("jobs_status", "--json")
    data = json.loads(capsys.readouterr().out)
    assert next(q for q in data["queues"] if q["queue"] == "wf-cb")["blocked"] == 1


def test_metrics_report_blocked_jobs() -> None:
    Queue.objects.create(name="wf-m")  # a known queue keeps its label (others: "other")
    chain(w.double.s(1), w.double.using(queue="wf-m").s()).enqueue()
    collector = QueueCollector()
    refresher = QueueStatsRefresher(collector, alias="default", interval=60)
    assert refresher.refresh_once()
    samples = {
        (s.labels["queue"], s.labels["state"]): s.value
        for family in collector.collect()
        for s in family.samples
        if family.name == "pgjobs_queue_jobs"
    }
    assert samples[("wf-m", "blocked")] == 1 and samples[("wf-m", "pending")] == 0


# -- admin ----------------------------------------------------------------------------


def test_admin_pages_of_a_run(admin_client: Client) -> None:
    run = chain(w.explode.s(), w.double.si(1)).enqueue()
    run_jobs()
    page = admin_client.get(reverse("admin:django_pgjobs_workflow_change", args=[run.id]))
    text = page.content.decode()
    assert page.status_code == 200
    assert f"#{run.jobs[0].id}" in text and "ended dead" in text and "pgjobs-cancelled" in text
    listing = admin_client.get(reverse("admin:django_pgjobs_workflow_changelist"))
    assert listing.status_code == 200 and escape(run.name) in listing.content.decode()
    job_page = admin_client.get(reverse("admin:django_pgjobs_job_change", args=[run.jobs[1].id]))
    link = reverse("admin:django_pgjobs_workflow_change", args=[run.id])
    assert f'href="{link}"' in job_page.content.decode()
    overview_page = admin_client.get(reverse("admin:django_pgjobs_job_overview"))
    assert overview_page.status_code == 200 and ">blocked<" in overview_page.content.decode()


def test_admin_cancel_runs_and_retry_resumes(admin_client: Client) -> None:
    run = chain(w.double.s(1), w.double.s(), w.double.s()).enqueue()
    response = admin_client.post(
        reverse("admin:django_pgjobs_workflow_changelist"),
        {"action": "cancel_runs", "_selected_action": [run.id]},
        follow=True,
    )
    assert "Cancelled 3 job(s) of 1 run(s)." in response.content.decode()
    assert set(Job.objects.filter(workflow_id=run.id).values_list("status", flat=True)) == {
        "cancelled"
    }
    failing = chain(w.explode.s(), w.double.si(1)).enqueue()
    run_jobs()
    admin_client.post(
        reverse("admin:django_pgjobs_job_changelist"),
        {"action": "retry_now", "_selected_action": [failing.jobs[0].id]},
    )
    assert Job.objects.get(id=failing.jobs[1].id).status == "blocked"


def test_nobody_adds_or_deletes_runs_in_the_admin(admin_client: Client) -> None:
    assert admin_client.get(reverse("admin:django_pgjobs_workflow_add")).status_code == 403


# -- pruning --------------------------------------------------------------------------


def test_a_parent_stays_while_its_child_waits_and_edges_go_with_the_child() -> None:
    wf_run = chord([w.double.s(1), w.wait_for_file.s("/nonexistent", 0.0)], w.add_up.s()).enqueue()
    run_jobs(max_jobs=1)  # the first member completes; the second keeps the callback waiting
    first = wf_run.jobs[0]
    old = {"finished_at": Job.objects.get(id=first.id).finished_at - timedelta(days=30)}
    Job.objects.filter(id=first.id).update(**old)
    Pruner().run_once()
    assert Job.objects.filter(id=first.id).exists(), "its child still waits for it"
    assert JobResult.objects.get(job_id=first.id).value == 2
    # the callback runs and finishes: then the parent, and later the child, can go
    Job.objects.filter(id=wf_run.jobs[1].id).update(
        status="completed", finished_at=old["finished_at"]
    )
    run_jobs()
    Job.objects.filter(workflow_id=wf_run.id).update(finished_at=old["finished_at"])
    Pruner().run_once()
    assert not Job.objects.filter(workflow_id=wf_run.id).exists()
    assert not JobDependency.objects.exists()


def test_the_run_page_escapes_what_users_named(admin_client: Client) -> None:
    from django_pgjobs import Workflow

    wf = Workflow("<img src=x onerror=alert(1)>")
    wf.add(w.double.s(1), name="<script>alert(2)</script>")
    run = wf.enqueue()
    text = admin_client.get(
        reverse("admin:django_pgjobs_workflow_change", args=[run.id])
    ).content.decode()
    assert "<script>alert(2)</script>" not in text and "<img src=x" not in text
    assert escape("<script>alert(2)</script>") in text


# -- retrying a parent and its cancelled children in one statement ----------------------


def _cancelled_chain(length: int) -> list[int]:
    """A chain whose first node was cancelled: every later node is cancelled by it."""
    run = chain(w.double.s(1), *[w.double.s() for _ in range(length - 1)]).enqueue()
    ids = [j.id for j in run.jobs]
    Job.objects.filter(id=ids[0]).cancel()
    assert [Job.objects.get(id=i).status for i in ids] == ["cancelled"] * length
    return ids


def _state(ids: list[int]) -> list[tuple[str, int | None]]:
    rows = {j.id: (j.status, j.waiting) for j in Job.objects.filter(id__in=ids)}
    return [rows[i] for i in ids]


def test_a_child_retried_with_its_parent_waits_for_it() -> None:
    """The child that the parent's failure cancelled, retried in the same statement,
    waits for the parent again, rather than going pending and running first."""
    ids = _cancelled_chain(3)
    assert Job.objects.filter(id__in=ids).retry() == 3
    assert _state(ids) == [("pending", 0), ("blocked", 1), ("blocked", 1)]
    child = Job.objects.get(id=ids[1])
    assert (child.failed_parents, child.cancelled_by, child.last_error) == (0, None, None)
    # released by the parent's completion, as usual: each runs after its parent
    assert [(r.id, r.value) for r in run_jobs()] == [(ids[0], 2), (ids[1], 4), (ids[2], 8)]


def test_a_child_retried_with_one_of_two_parents_waits_for_that_one() -> None:
    """Only the parents unfinished after the statement count: a retried child of a
    retried parent and of a still pending one waits for both."""
    wf_run = chord([w.double.s(1), w.wait_for_file.s("/nonexistent", 0.0)], w.add_up.s()).enqueue()
    first, second, callback = (j.id for j in wf_run.jobs)
    Job.objects.filter(id=first).cancel()
    assert _state([callback]) == [("cancelled", 1)]
    assert Job.objects.filter(id__in=[first, callback]).retry() == 2
    assert _state([first, second, callback]) == [("pending", 0), ("pending", 0), ("blocked", 2)]


def test_the_admin_retry_and_retry_jobs_keep_the_order(admin_client: Client) -> None:
    ids = _cancelled_chain(2)
    admin_client.post(
        reverse("admin:django_pgjobs_job_changelist"),
        {"action": "retry_now", "_selected_action": ids},
    )
    assert _state(ids) == [("pending", 0), ("blocked", 1)]
    ids = _cancelled_chain(2)
    call_command("retry_jobs", "--ids", ",".join(map(str, ids)), "--status", "cancelled")
    assert _state(ids) == [("pending", 0), ("blocked", 1)]
