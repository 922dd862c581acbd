"""Operating on jobs from code and the shell (docs/howto/operate-the-queue.md):
``Job.objects...retry()`` /
``.cancel()``, ``manage.py retry_jobs`` / ``cancel_jobs``, ``jobs_status --check``."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_pgjobs.jobs import operations
from django_pgjobs.models import Job
from django_pgjobs.states import JobStatus
from tests.conftest import ROOT
from tests.helpers.rows import make_job, snapshot

pytestmark = pytest.mark.django_db(transaction=True)


def status_of(*jobs: Job) -> list[str]:
    return [Job.objects.get(pk=j.pk).status for j in jobs]


# --------------------------------------------------------------------------- the API


def test_every_queryset_method_is_on_the_manager() -> None:
    for name in (
        "pending",
        "due",
        "running",
        "stuck",
        "dead",
        "finished",
        "retry",
        "cancel",
        "retryable",
        "cancellable",
    ):
        assert callable(getattr(Job.objects, name)), name
    assert callable(Job.objects.enqueue)


def test_retry_moves_dead_cancelled_and_stuck_jobs_and_leaves_the_rest() -> None:
    dead = make_job(JobStatus.DEAD, attempts=5, lease=3)
    cancelled = make_job(JobStatus.CANCELLED, lease=2)
    stuck = make_job(JobStatus.RUNNING, heartbeat_age=3600, lease=7)
    healthy = make_job(JobStatus.RUNNING, heartbeat_age=0)
    done = make_job(JobStatus.COMPLETED)
    pending = make_job(JobStatus.PENDING)
    untouched = {j.pk: snapshot(j.pk) for j in (healthy, done, pending)}

    assert Job.objects.all().retry() == 3

    assert status_of(dead, cancelled, stuck) == ["pending"] * 3
    after = {j.pk: Job.objects.get(pk=j.pk) for j in (dead, cancelled, stuck)}
    assert [after[j.pk].attempts for j in (dead, cancelled, stuck)] == [0, 0, 0]
    assert [after[j.pk].lease for j in (dead, cancelled, stuck)] == [4, 3, 8]  # fenced
    assert {pk: snapshot(pk) for pk in untouched} == untouched


def test_retry_of_a_filtered_selection_changes_only_it() -> None:
    mine = make_job(JobStatus.DEAD, task="tests.testapp.jobs.noop", args=[])
    other = make_job(JobStatus.DEAD)
    assert Job.objects.filter(task="tests.testapp.jobs.noop").retry() == 1
    assert status_of(mine, other) == ["pending", "dead"]
    assert Job.objects.dead().retry() == 1
    assert Job.objects.dead().retry() == 0


def test_cancel_moves_pending_and_running_only_and_bumps_the_lease() -> None:
    pending = make_job(JobStatus.PENDING)
    running = make_job(JobStatus.RUNNING, lease=4)
    dead = make_job(JobStatus.DEAD)
    before = snapshot(dead.pk)
    assert Job.objects.all().cancel() == 2
    assert status_of(pending, running, dead) == ["cancelled", "cancelled", "dead"]
    assert Job.objects.get(pk=running.pk).lease == 5
    assert snapshot(dead.pk) == before


def test_retry_and_cancel_run_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operations, "CHUNK", 2)
    jobs = [make_job(JobStatus.DEAD) for _ in range(5)]
    statements: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        assert Job.objects.filter(pk__in=[j.pk for j in jobs]).retry() == 5
    assert sum("lease = j.lease + 1" in s for s in statements) == 3  # 2 + 2 + 1
    assert Job.objects.filter(pk__in=[j.pk for j in jobs[:3]]).cancel() == 3


@pytest.mark.parametrize("caller", ["queryset", "admin", "command"])
def test_every_caller_chunks_with_the_one_constant(
    caller: str, monkeypatch: pytest.MonkeyPatch, admin_client: Any
) -> None:
    """The queryset, the admin's actions and the commands retry and cancel through
    ``operations`` (one CHUNK, one fenced statement per chunk)."""
    from tests.helpers.admin_rows import post_action

    monkeypatch.setattr(operations, "CHUNK", 2)
    ids = [make_job(JobStatus.DEAD).pk for _ in range(5)]
    statements: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    retry = {
        "queryset": lambda: Job.objects.filter(pk__in=ids).retry(),
        "admin": lambda: post_action(admin_client, "retry_now", ids),
        "command": lambda: call_command("retry_jobs", "--ids", ",".join(map(str, ids))),
    }[caller]
    with connection.execute_wrapper(count):
        retry()
    assert sum("lease = j.lease + 1" in s for s in statements) == 3  # 2 + 2 + 1
    assert set(status_of(*Job.objects.filter(pk__in=ids))) == {"pending"}


def test_retry_of_a_slice_takes_the_slice() -> None:
    jobs = [make_job(JobStatus.DEAD) for _ in range(3)]
    assert Job.objects.dead().order_by("id")[:2].retry() == 2
    assert status_of(*jobs) == ["pending", "pending", "dead"]


# --------------------------------------------------------------------------- commands


def test_retry_jobs_retries_dead_jobs_by_default(capsys: Any) -> None:
    dead = make_job(JobStatus.DEAD)
    cancelled = make_job(JobStatus.CANCELLED)
    call_command("retry_jobs")
    assert capsys.readouterr().out == "Retried 1 job.\n"
    assert status_of(dead, cancelled) == ["pending", "cancelled"]
    call_command("retry_jobs", "--status", "cancelled")
    assert status_of(cancelled) == ["pending"]


def test_retry_jobs_filters_by_ids_task_and_queue(capsys: Any) -> None:
    a = make_job(JobStatus.DEAD, queue="a")
    b = make_job(JobStatus.DEAD, queue="b")
    c = make_job(JobStatus.DEAD, queue="b", task="tests.testapp.jobs.noop", args=[])
    call_command("retry_jobs", "--queue", "b", "--task", "tests.testapp.jobs.noop")
    assert status_of(a, b, c) == ["dead", "dead", "pending"]
    call_command("retry_jobs", "--ids", f"{a.pk}, {c.pk}")
    assert status_of(a, b, c) == ["pending", "dead", "pending"]
    assert capsys.readouterr().out == "Retried 1 job.\nRetried 1 job.\n"


def test_dry_run_lists_and_changes_nothing(capsys: Any) -> None:
    jobs = [make_job(JobStatus.DEAD) for _ in range(2)]
    stuck = make_job(JobStatus.RUNNING, heartbeat_age=3600)
    healthy = make_job(JobStatus.RUNNING)
    before = {j.pk: snapshot(j.pk) for j in (*jobs, stuck, healthy)}
    call_command("retry_jobs", "--dry-run")
    call_command("retry_jobs", "--status", "running", "--dry-run")
    call_command("cancel_jobs", "--status", "running", "--dry-run")
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"Would retry 2 jobs: #{jobs[0].pk}, #{jobs[1].pk} (dry run: nothing changed).",
        f"Would retry 1 job: #{stuck.pk} (dry run: nothing changed).",
        f"Would cancel 2 jobs: #{stuck.pk}, #{healthy.pk} (dry run: nothing changed).",
    ]
    assert {pk: snapshot(pk) for pk in before} == before


def test_cancel_jobs_needs_a_selector_and_cancels_it(capsys: Any) -> None:
    job = make_job(JobStatus.PENDING, queue="emails")
    other = make_job(JobStatus.PENDING)
    with pytest.raises(CommandError, match="needs --ids, --task, --queue or --status"):
        call_command("cancel_jobs")
    assert status_of(job, other) == ["pending", "pending"]
    call_command("cancel_jobs", "--queue", "emails")
    assert capsys.readouterr().out == "Cancelled 1 job.\n"
    assert status_of(job, other) == ["cancelled", "pending"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["retry_jobs", "--ids", "12,x"],
            "argument --ids: expected comma-separated job ids, got 'x'",
        ),
        (
            ["retry_jobs", "--status", "pending"],
            "argument --status: 'pending' is not a status this command changes; choose from dead, "
            "cancelled, running",
        ),
        (["cancel_jobs", "--status", "dead"], "argument --status: 'dead' is not a status"),
        (["retry_jobs", "--ids", "0"], "argument --ids: job ids are positive 64-bit numbers"),
    ],
)
def test_bad_arguments_name_the_option_and_write_nothing(argv: list[str], message: str) -> None:
    job = make_job(JobStatus.DEAD)
    before = snapshot(job.pk)
    env = _env()
    proc = subprocess.run(
        [sys.executable, "-m", "django", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert snapshot(job.pk) == before


def _env() -> dict[str, str]:
    import os

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PGJOBS_WORKER_DB_NAME": connection.settings_dict["NAME"],
        "PYTHONPATH": str(ROOT),
    }


# --------------------------------------------------------------------------- jobs_status --check


def _status_check(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "jobs_status", "--check", *extra],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_jobs_status_check_exits_0_when_healthy_and_1_on_a_warning() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        server_autovacuum = cursor.fetchone()[0] == "on"
    healthy = _status_check()
    warnings = [line for line in healthy.stdout.splitlines() if line.startswith("WARNING")]
    if server_autovacuum:
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert warnings == []
    else:  # this machine's server runs with autovacuum off: that is the one warning
        assert healthy.returncode == 1
        assert len(warnings) == 1 and "autovacuum is off" in warnings[0]
        assert healthy.stderr == "jobs_status --check: 1 warning(s)\n"

    make_job(JobStatus.RUNNING, heartbeat_age=3600, queue="stuckq")
    warned = _status_check()
    assert warned.returncode == 1
    assert "WARNING: queue 'stuckq': 1 running job(s) with a stale heartbeat" in warned.stdout
    assert "jobs_status --check: " in warned.stderr
    as_json = _status_check("--json")
    assert as_json.returncode == 1
    assert "stale heartbeat" in as_json.stdout


def test_jobs_status_check_warns_about_due_work_without_a_worker() -> None:
    make_job(JobStatus.PENDING, queue="orphan")
    proc = _status_check()
    assert proc.returncode == 1
    assert "queue 'orphan': 1 job(s) due and no live worker serves this queue" in proc.stdout


def test_jobs_status_without_check_still_exits_0_on_warnings(capsys: Any) -> None:
    make_job(JobStatus.PENDING, queue="orphan")
    call_command("jobs_status")
    assert "WARNING" in capsys.readouterr().out
