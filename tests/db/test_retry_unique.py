"""Retrying a dead or cancelled ``@job(unique_while=...)`` job whose key another job holds.

A second enqueue of a held key writes nothing and returns the holder. A
retry (admin action, ``.retry()``, ``retry_jobs``) follows the same rule: that job is
skipped and reported with its holder, the rest of the selection is retried, and the
statement never fails on the unique index — also when two retries (or a retry and an
enqueue) of the same key race, on two real connections.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import Client

from django_pgjobs.db.job_admin import Retried
from django_pgjobs.models import Job
from django_pgjobs.states import JobStatus
from tests import flow_jobs
from tests.conftest import wait_until
from tests.helpers.admin_rows import messages_of, post_action
from tests.helpers.rows import make_job

pytestmark = pytest.mark.django_db(transaction=True)


def finished_keyed(status: str = JobStatus.DEAD, account: int = 1) -> Job:
    """A refresh_account job that finished in ``status``: it keeps its key, unheld."""
    job_row = make_job(status, task="tests.flow_jobs.refresh_account", args=[account])
    assert job_row.unique_key is not None
    return job_row


def status_of(*jobs: Job) -> list[str]:
    by_id = dict(Job.objects.filter(id__in=[j.id for j in jobs]).values_list("id", "status"))
    return [by_id[j.id] for j in jobs]


def test_retry_skips_a_job_whose_key_is_held_and_retries_the_rest() -> None:
    old = finished_keyed(JobStatus.DEAD)
    holder = flow_jobs.refresh_account.enqueue(1)  # the key is free again: a new job
    gone = finished_keyed(JobStatus.CANCELLED, account=2)
    plain = make_job(JobStatus.DEAD)
    selection = Job.objects.filter(id__in=[old.id, gone.id, plain.id])

    assert selection.retry() == 2
    assert status_of(old, holder, gone, plain) == ["dead", "pending", "pending", "pending"]
    assert Job.objects.get(id=old.id).lease == old.lease, "the skipped job is untouched"
    # Again: the skipped job is still skipped, and now says by whom.
    result = selection.retry_detailed()
    assert result.changed == set() and result.held == {old.id: holder.id}


def test_two_jobs_of_one_key_in_one_retry_only_the_first_takes_it() -> None:
    first = finished_keyed()
    second = finished_keyed()
    result = Job.objects.filter(id__in=[first.id, second.id]).retry_detailed()
    assert result.changed == {first.id} and result.held == {second.id: first.id}
    assert status_of(first, second) == ["pending", "dead"]


def test_a_cancelled_pending_mode_job_is_skipped_while_its_key_is_pending() -> None:
    cancelled = make_job(
        JobStatus.CANCELLED,
        task="tests.flow_jobs.rebuild_index",
        args=["users"],
        queue="flow-unique",
    )
    assert cancelled.unique_key is not None
    holder = flow_jobs.rebuild_index.enqueue("users")
    assert Job.objects.filter(id=cancelled.id).retry() == 0
    assert status_of(cancelled, holder) == ["cancelled", "pending"]


def test_a_stuck_running_keyed_job_is_retried_it_holds_its_own_key() -> None:
    old = finished_keyed()
    stuck = make_job(
        JobStatus.RUNNING, task="tests.flow_jobs.refresh_account", args=[1], heartbeat_age=3600
    )
    assert stuck.id != old.id
    result = Job.objects.filter(id__in=[stuck.id, old.id]).retry_detailed()
    assert result.changed == {stuck.id} and result.held == {old.id: stuck.id}


def test_admin_retry_names_the_job_skipped_for_its_key(admin_client: Client) -> None:
    old = finished_keyed()
    holder = flow_jobs.refresh_account.enqueue(1)
    plain = make_job(JobStatus.DEAD)

    response = post_action(admin_client, "retry_now", [old.id, plain.id])

    assert response.status_code == 200
    [message] = messages_of(response)
    assert message == (
        f"Retried 1 job; skipped 1 whose unique key is held by another pending "
        f"or running job (#{old.id} (held by #{holder.id}))."
    )
    assert status_of(old, plain) == ["dead", "pending"]


def test_retry_jobs_command_reports_the_skipped_job(capsys: Any) -> None:
    old = finished_keyed()
    holder = flow_jobs.refresh_account.enqueue(1)
    plain = make_job(JobStatus.DEAD)
    call_command("retry_jobs")
    assert capsys.readouterr().out == (
        "Retried 1 job.\n"
        f"Skipped 1 job whose unique key is held by another pending or running job: "
        f"#{old.id} (held by #{holder.id}).\n"
    )
    assert status_of(old, plain, holder) == ["dead", "pending", "pending"]


# -- races, on two real connections ---------------------------------------------------


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        return bool(cursor.fetchone()[0])


def _race(first: Callable[[], Any], *, commit: bool, second_ids: list[int]) -> Retried:
    """Run ``first`` in an open transaction on one connection, start a retry of
    ``second_ids`` on another, wait until it blocks, then end the first transaction."""
    started, finish = threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def hold() -> None:
        try:
            with transaction.atomic():
                first()
                started.set()
                finish.wait(30)
                if not commit:
                    transaction.set_rollback(True)
        finally:
            connections.close_all()

    def retry() -> None:
        try:
            out["result"] = Job.objects.filter(id__in=second_ids).retry_detailed()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            out["error"] = exc
        finally:
            connections.close_all()

    holder_thread = threading.Thread(target=hold)
    holder_thread.start()
    assert started.wait(30)
    retry_thread = threading.Thread(target=retry)
    retry_thread.start()
    wait_until(_waiting_on_a_lock, message="the second retry waits for the first")
    finish.set()
    holder_thread.join(30)
    retry_thread.join(30)
    assert "error" not in out, out.get("error")
    return out["result"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("commit", [True, False])
def test_concurrent_retries_of_one_key_never_both_succeed_nor_fail(commit: bool) -> None:
    a, b = finished_keyed(), finished_keyed()
    result = _race(lambda: Job.objects.filter(id=a.id).retry(), commit=commit, second_ids=[b.id])
    if commit:
        assert result.changed == set() and result.held == {b.id: a.id}
        assert status_of(a, b) == ["pending", "dead"]
    else:  # the first retry rolled back: the key was free for the second one
        assert result.changed == {b.id} and result.held == {}
        assert status_of(a, b) == ["dead", "pending"]


def test_a_retry_racing_an_enqueue_of_its_key_is_skipped_not_an_error() -> None:
    old = finished_keyed()
    plain = make_job(JobStatus.DEAD)
    result = _race(
        lambda: flow_jobs.refresh_account.enqueue(1), commit=True, second_ids=[old.id, plain.id]
    )
    holder = Job.objects.get(unique_key=old.unique_key, status=JobStatus.PENDING)
    assert result.changed == {plain.id} and result.held == {old.id: holder.id}
    assert status_of(old, plain) == ["dead", "pending"]
