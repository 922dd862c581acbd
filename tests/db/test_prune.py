"""The pruner and ``manage.py prune_jobs``: only old finished rows go, in bounded batches."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test import override_settings

from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.maintenance.services import MaintenanceThread
from django_pgjobs.models import Job, JobResult
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86400


def make(
    status: str,
    n: int,
    *,
    age_days: float | None,
    key_prefix: str | None = None,
    queue: str = "default",
) -> None:
    """Insert ``n`` rows in ``status`` finished ``age_days`` ago, with a result each."""
    keys = "NULL" if key_prefix is None else f"'{key_prefix}' || g"
    finished = "NULL" if age_days is None else f"now() - make_interval(secs => {age_days * DAY})"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH ins AS (
                INSERT INTO django_pgjobs_job (task, queue, status, finished_at, idempotency_key)
                SELECT 'tests.testapp.jobs.noop', %s, %s, {finished}, {keys}
                  FROM generate_series(1, %s) AS g
                RETURNING id, idempotency_key, status
            )
            INSERT INTO django_pgjobs_jobresult (job_id, idempotency_key, value)
            SELECT id, idempotency_key, '1' FROM ins WHERE status = 'completed'
        """,
            [queue, status, n],
        )


def count(**filters: Any) -> int:
    return Job.objects.filter(**filters).count()


@pytest.fixture
def history() -> None:
    make("completed", 35, age_days=10)  # old: goes
    make("completed", 5, age_days=1)  # young: stays
    make("dead", 4, age_days=10)  # dead keeps 30 days: stays
    make("dead", 3, age_days=40)  # old dead: goes
    make("cancelled", 2, age_days=8)  # goes
    make("pending", 6, age_days=None)  # live work: never touched
    make("completed", 3, age_days=10, key_prefix="order:")  # goes, result kept (key protects)
    make("completed", 2, age_days=10, key_prefix="cron:x:")  # goes, cron result goes too


def test_only_old_finished_rows_go_in_bounded_batches(history: None) -> None:
    result = Pruner(batch=10).run_once()
    assert result["by_status"] == {"cancelled": 2, "completed": 40, "dead": 3}
    assert result["complete"] and all(1 <= b <= 10 for b in result["batches"])
    assert result["batches"] == [2, 10, 10, 10, 10, 3]
    assert count(status="completed") == 5 and count(status="dead") == 4
    assert count(status="pending") == 6 and count(status="cancelled") == 0
    # Results: keyed ones stay (their key keeps protecting); cron keys and unkeyed go.
    kept = list(JobResult.objects.values_list("idempotency_key", flat=True))
    assert sorted(k for k in kept if k) == ["order:1", "order:2", "order:3"]
    assert kept.count(None) == 5  # the young completed jobs' results


def test_retention_none_keeps_a_status_forever(history: None) -> None:
    with override_settings(PGJOBS={"RETENTION": {"dead": None}}):
        result = Pruner().run_once()
    assert result["by_status"] == {"cancelled": 2, "completed": 40}
    assert count(status="dead") == 7


def test_time_budget_stops_a_pass_early(history: None) -> None:
    result = Pruner(batch=1, time_budget=0).run_once()
    assert not result["complete"] and result["deleted"] <= 1


def test_a_pass_cut_short_by_its_budget_is_due_again_soon(history: None) -> None:
    """At 300 s between passes and 2 s a pass, a worker's pruner deleted at most a few
    hundred rows a second: behind a busy queue the table outgrew its retention. A pass
    that stopped at its budget with rows left now runs again after BEHIND_INTERVAL."""
    assert Pruner().interval == 300  # the default: no second pass within this test

    class Counted(Pruner):
        passes: list[dict[str, Any]] = []

        def run_once(self, statuses: Any = None) -> dict[str, Any]:
            self.passes.append(super().run_once(statuses))
            return self.passes[-1]

    stop = threading.Event()
    pruner = Counted(batch=1, time_budget=0.01)  # a few rows a pass: many passes needed
    thread = MaintenanceThread([pruner], stop, "default", behind_interval=0.05)
    thread.start()
    try:
        wait_until(lambda: count() == 5 + 4 + 6, message="every old finished row pruned")
    finally:
        stop.set()
        thread.join(10)
    assert len(pruner.passes) > 1 and not pruner.passes[0]["complete"]
    assert count(status="completed") == 5 and count(status="dead") == 4  # the young ones
    assert count(status="pending") == 6 and JobResult.objects.count() == 5 + 3


def test_pruners_on_many_hosts_share_the_work() -> None:
    make("completed", 3000, age_days=10)
    make("completed", 50, age_days=0.5)
    results: list[dict[str, Any]] = []
    failures: list[BaseException] = []

    def host() -> None:
        try:
            results.append(Pruner(batch=100).run_once())
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=host) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures == []
    assert sum(r["deleted"] for r in results) == 3000
    assert count() == 50


def test_command_dry_run_counts_and_deletes_nothing(history: None, capsys: Any) -> None:
    call_command("prune_jobs", "--dry-run")
    out = capsys.readouterr().out
    assert "would delete 40 completed" in out and "would delete 3 dead" in out
    assert count() == 60


def test_command_older_than_and_status(history: None, capsys: Any) -> None:
    call_command("prune_jobs", "--older-than", "12h", "--status", "completed", "--batch", "7")
    out = capsys.readouterr().out
    assert "deleted 45 completed job(s) finished more than 43200s ago" in out
    assert count(status="completed") == 0 and count(status="dead") == 7


def test_command_older_than_overrides_none_only_when_named(history: None) -> None:
    with override_settings(PGJOBS={"RETENTION": {"dead": None}}):
        call_command("prune_jobs", "--older-than", "9d")
        assert count(status="dead") == 7
        call_command("prune_jobs", "--older-than", "9d", "--status", "dead")
        assert count(status="dead") == 0


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--older-than", "soon"], "expected a duration"),
        (["--older-than", "0d"], "positive duration"),
        (["--status", "pending"], "not a finished status"),
        (["--batch", "0"], "at least 1"),
    ],
)
def test_command_rejects_bad_arguments(argv: list[str], fragment: str, history: None) -> None:
    with pytest.raises(CommandError, match=fragment):
        call_command("prune_jobs", *argv)
    assert count() == 60


def test_command_with_nothing_to_prune_says_why() -> None:
    with (
        override_settings(
            PGJOBS={"RETENTION": {"completed": None, "dead": None, "cancelled": None}}
        ),
        pytest.raises(CommandError, match="RETENTION None"),
    ):
        call_command("prune_jobs")
