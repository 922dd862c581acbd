"""Workflows meet retention: the pruner (``Pruner``, ``prune_jobs`` and the pg_cron
entry) keeps finished members of an unfired batch and finished parents of an
unfinished child; a batch counts what joined; a parent whose row is gone anyway
fails its child with ``ParentResultMissing``; a batch's callback key is checked when
the block opens; an abandoned open batch is closed by the repair pass."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import F

from django_pgjobs import batch, chain
from django_pgjobs.exceptions import ParentResultMissing
from django_pgjobs.maintenance.pg_cron_engine import PRUNE_ENTRY, maintenance_entries
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.maintenance.workflow_repair import WorkflowRepair
from django_pgjobs.models import Job, JobResult
from django_pgjobs.models import Workflow as WorkflowRow
from django_pgjobs.testing import run_jobs
from django_pgjobs.workflows import WorkflowConflict
from tests import workflow_jobs as w
from tests.conftest import ROOT, dsn

pytestmark = pytest.mark.django_db(transaction=True)

#: A retention shorter than a slow import loop's block: completed jobs kept two seconds.
SHORT = {"completed": 2}


@pytest.fixture
def short_retention(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "RETENTION": SHORT}


def age_finished(**filters: Any) -> None:
    """Finished long ago, as far as any retention is concerned."""
    Job.objects.filter(finished_at__isnull=False, **filters).update(
        finished_at=F("finished_at") - timedelta(days=30)
    )


def summaries() -> list[Any]:
    return list(
        Job.objects.filter(task=w.summarise.name, status="completed").values_list("id", flat=True)
    )


def test_a_batch_open_past_the_retention_fires_once_with_every_member(
    short_retention: None,
) -> None:
    """Five members run and pass their retention while the block is still open; the
    pruner keeps them, the close counts ten, and the callback waits for the rest."""
    with batch(on_complete=w.summarise.s()) as b:
        for i in range(5):
            w.double.enqueue(i)
        assert len(run_jobs()) == 5
        age_finished(workflow_id=b.id)
        Pruner().run_once()
        for i in range(5, 10):
            w.double.enqueue(i)
    assert b.members == 10
    assert Job.objects.filter(workflow_id=b.id, waiting__isnull=True).count() == 10
    assert Job.objects.get(node="on_complete").status == "blocked"
    results = run_jobs()
    fired = [r.value for r in results if r.task == w.summarise.name]
    assert fired == [{"label": "", "completed": 10, "dead": 0, "cancelled": 0}]
    assert len(summaries()) == 1
    # fired: now its members go at their retention
    age_finished(workflow_id=b.id)
    Pruner().run_once()
    assert not Job.objects.filter(workflow_id=b.id, waiting__isnull=True).exists()


def test_prune_jobs_and_the_pg_cron_entry_keep_an_open_batchs_members(
    short_retention: None,
) -> None:
    with batch(on_complete=w.summarise.s()) as b:
        w.double.enqueue(1)
        run_jobs()
        age_finished(workflow_id=b.id)
        call_command("prune_jobs")
        with psycopg.connect(dsn(), autocommit=True) as conn:
            [prune] = [e for e in maintenance_entries(conn) if e.jobname == PRUNE_ENTRY]
            conn.execute(prune.command)
        assert Job.objects.filter(workflow_id=b.id, status="completed").count() == 1
        w.double.enqueue(2)
    assert b.members == 2


def test_a_closed_unfired_batch_keeps_its_finished_members(short_retention: None) -> None:
    with batch(on_complete=w.summarise.s()) as b:
        first = w.double.enqueue(1)
        w.double.enqueue(2)
    run_jobs(max_jobs=1)
    assert Job.objects.get(id=first.id).status == "completed"
    age_finished(id=first.id)
    Pruner().run_once()
    assert Job.objects.filter(id=first.id).exists(), "its batch has not fired"
    fired = [r.value for r in run_jobs() if r.task == w.summarise.name]
    assert fired == [{"label": "", "completed": 2, "dead": 0, "cancelled": 0}]
    assert WorkflowRow.objects.get(id=b.id).members == 2


def test_a_released_childs_pruned_parent_is_kept_and_its_result_passed_on(
    short_retention: None,
) -> None:
    """The child was released (pending) but has not run (a backlog, a pause): its
    parent passes its retention and stays, so the child gets the real result."""
    run = chain(w.double.s(3), w.double.s()).enqueue()
    run_jobs(max_jobs=1)
    parent, child = run.jobs
    assert Job.objects.get(id=child.id).status == "pending"
    age_finished(id=parent.id)
    Pruner().run_once()
    assert Job.objects.filter(id=parent.id).exists()
    [result] = run_jobs()
    assert (result.status, result.value) == ("completed", 12)
    age_finished(workflow_id=run.id)
    Pruner().run_once()
    assert not Job.objects.filter(workflow_id=run.id).exists()


def test_a_parent_deleted_by_hand_fails_its_child_naming_it() -> None:
    run = chain(w.double.s(3), w.double.s()).enqueue()
    run_jobs(max_jobs=1)
    parent, child = run.jobs
    JobResult.objects.filter(job_id=parent.id).delete()
    Job.objects.filter(id=parent.id).delete()
    [result] = run_jobs()
    assert result.status == "dead"
    row = Job.objects.get(id=child.id)
    assert row.attempts == 1, "not retried: running it again cannot bring the result back"
    assert row.errors[-1]["type"] == "django_pgjobs.exceptions.ParentResultMissing"
    assert f"parent job {parent.id}" in row.last_error
    assert issubclass(ParentResultMissing, Exception)


def test_a_taken_callback_key_fails_the_block_before_any_member_is_written() -> None:
    holder = w.double.using(idempotency_key="batch-done").enqueue(1)
    body_ran = False
    with (
        pytest.raises(WorkflowConflict, match="batch-done"),
        batch(on_complete=w.summarise.using(idempotency_key="batch-done").s()),
    ):
        body_ran = True
        w.double.enqueue(2)
    assert not body_ran
    assert list(Job.objects.values_list("id", flat=True)) == [holder.id]
    assert not WorkflowRow.objects.exists()


#: A process that opens a batch, enqueues three members in autocommit, and is killed
#: (SIGKILL) inside the block: the close never runs.
_DIES_IN_THE_BLOCK = """
import os, signal
import django
django.setup()
from django_pgjobs import batch
from tests import workflow_jobs as w
b = batch(on_complete=w.summarise.s(label="left"))
b.__enter__()
for i in range(3):
    w.double.enqueue(i)
print(b.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_abandoned_open_batch_is_closed_by_the_repair_pass(caplog: Any) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PGJOBS_WORKER_DB_NAME": connection.settings_dict["NAME"],
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _DIES_IN_THE_BLOCK],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    run_id = int(proc.stdout.split()[0])
    row = WorkflowRow.objects.get(id=run_id)
    assert row.closed_at is None and row.members is None
    assert Job.objects.get(node="on_complete", workflow_id=run_id).status == "blocked"
    run_jobs()  # the members finish; the batch stays open
    assert Job.objects.get(node="on_complete").status == "blocked"
    assert WorkflowRepair().run_once()["abandoned"] == 0, "inside the grace period"
    assert WorkflowRepair(abandoned_after=0).run_once()["abandoned"] == 1
    assert "was left open" in caplog.text
    assert WorkflowRow.objects.get(id=run_id).members == 3
    fired = [r.value for r in run_jobs() if r.task == w.summarise.name]
    assert fired == [{"label": "left", "completed": 3, "dead": 0, "cancelled": 0}]
    assert WorkflowRepair(abandoned_after=0).run_once()["abandoned"] == 0


def test_the_prune_statement_probes_per_workflow_row_and_never_scans_the_jobs() -> None:
    """The kept-rows test is a probe of the row at hand (the edges' parent index, the
    child's and the run's primary keys); a hashed subquery would read every
    unfinished job of the table once per batch."""
    from django_pgjobs.db.prune import JOB_PRUNE_BATCH

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_pgjobs_job (task, status, run_at)"
            " SELECT 'x', 'pending', now() + interval '1 day' FROM generate_series(1, 20000)"
        )
    with batch():
        for i in range(3):
            w.double.enqueue(i)
    chain(w.double.s(1), w.double.s()).enqueue()
    run_jobs()
    age_finished()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_pgjobs_job")
        cursor.execute("ANALYZE django_pgjobs_jobdependency")
        cursor.execute("BEGIN")
        cursor.execute(
            "EXPLAIN (COSTS OFF) " + JOB_PRUNE_BATCH,
            {"status": "completed", "older_than": 86400, "batch": 1000},
        )
        plan = "\n".join(r[0] for r in cursor.fetchall())
        cursor.execute("ROLLBACK")
    assert not re.search(r"Seq Scan on django_pgjobs_job\s", plan), plan
    assert "hashed SubPlan" not in plan, plan
