"""Durable jobs run in the test's process (``run_jobs``): steps replayed, not re-run; a
raising step not stored; sleeps that park the job and wake it; code changes refused
(``NonDeterministic``) or accepted behind ``patched``; ``MAX_STEPS``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import override_settings
from django.utils import timezone

from django_pgjobs import chain
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.models import Job, JobStep, Queue
from django_pgjobs.testing import run_jobs
from tests import durable_jobs, flow_keyed_jobs
from tests.durable_jobs import CALLS, CODE

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    CALLS.clear()
    CODE["version"] = 1
    yield
    CALLS.clear()
    CODE["version"] = 1


def _steps(job_id: int) -> list[tuple[int, str, int, str]]:
    return list(
        JobStep.objects.filter(job_id=job_id)
        .order_by("seq")
        .values_list("seq", "name", "occurrence", "kind")
    )


def test_a_sleep_parks_the_job_and_finished_steps_are_not_run_again() -> None:
    job = durable_jobs.three_steps.enqueue(1)
    [ran] = run_jobs()
    assert ran.status == "waiting"
    row = Job.objects.get(id=job.id)
    assert row.status == "waiting"
    assert row.waiting_for == {"kind": "sleep", "name": "nap"}
    assert row.attempts == 0  # a park does not count the attempt
    assert CALLS == ["a"]
    assert run_jobs() == []  # not due for an hour
    [ran] = run_jobs(advance=timedelta(hours=1))
    assert (ran.status, ran.value) == ("completed", [2, 20])
    assert CALLS == ["a", "b"]  # "a" replayed from its record, not called again
    assert _steps(job.id) == [(0, "a", 0, "step"), (1, "nap", 0, "sleep"), (2, "b", 0, "step")]
    assert Job.objects.get(id=job.id).attempts == 1


def test_a_step_that_raises_is_not_stored_and_the_retry_skips_the_finished_ones() -> None:
    job = durable_jobs.fails_after_a_step.enqueue()
    [first] = run_jobs()
    assert first.status == "pending"  # retried after its backoff
    assert _steps(job.id) == [(0, "first", 0, "step")]  # "second" raised: not stored
    Job.objects.filter(id=job.id).update(run_at=timezone.now() - timedelta(hours=1))
    [second] = run_jobs()
    assert (second.status, second.value) == ("completed", "done")
    assert CALLS == ["first", "fail", "second"]
    assert [s[1] for s in _steps(job.id)] == ["first", "second"]


def test_an_atomic_step_runs_its_block_once_and_a_replay_returns_its_result() -> None:
    job = durable_jobs.grants.enqueue("g")
    [ran] = run_jobs()
    assert ran.status == "waiting"
    group_id = Group.objects.get(name="g").id
    [ran] = run_jobs(advance=timedelta(minutes=5))
    assert (ran.status, ran.value) == ("completed", group_id)
    assert CALLS == ["grant-block"]  # the replay skipped the block
    assert Group.objects.filter(name__startswith="g").count() == 2
    assert [s[1:] for s in _steps(job.id)] == [
        ("grant", 0, "atomic"),
        ("settle", 0, "sleep"),
        ("grant-2", 0, "atomic"),
    ]


def test_a_reordered_step_is_refused_with_nondeterministic_naming_the_steps() -> None:
    job = durable_jobs.versioned.enqueue()
    run_jobs()  # version 1: "a", then sleeps
    CODE["version"] = 2  # deployed: "b" now comes before "a"
    [ran] = run_jobs(advance=timedelta(hours=1))
    assert ran.status == "dead"
    assert ran.error is not None
    assert ran.error["type"] == "django_pgjobs.exceptions.NonDeterministic"
    assert "'b'" in ran.error["message"] and "'a'" in ran.error["message"]
    assert Job.objects.get(id=job.id).attempts == 1  # never retried on its own


def test_the_same_change_behind_patched_keeps_old_runs_on_their_branch() -> None:
    old = durable_jobs.versioned.enqueue()
    run_jobs()  # version 1 run: recorded "a" and the sleep
    CODE["version"] = 3
    new = durable_jobs.versioned.enqueue()
    ran = {r.id: r for r in run_jobs(advance=timedelta(hours=1))}
    assert (ran[old.id].status, ran[old.id].value) == ("completed", ["a", "b"])
    assert (ran[new.id].status, ran[new.id].value) == ("completed", ["b", "a"])
    assert _steps(new.id)[0][1:] == ("b-first", 0, "patch")


def test_a_step_added_after_a_sleep_does_not_strand_the_sleeping_job() -> None:
    job = durable_jobs.versioned.enqueue()
    run_jobs()
    CODE["version"] = 4  # a rolling deploy adds a step after the sleep
    [ran] = run_jobs(advance=timedelta(hours=1))
    assert (ran.status, ran.value) == ("completed", ["a", "added", "b"])
    assert [s[1] for s in _steps(job.id)] == ["a", "nap", "added", "b"]


@override_settings(PGJOBS={"MAX_STEPS": 3})
def test_more_steps_than_max_steps_dead_letters_the_job_with_a_clear_error() -> None:
    job = durable_jobs.many_steps.enqueue(4)
    [ran] = run_jobs()
    assert ran.status == "dead"
    assert ran.error is not None
    assert ran.error["type"] == "django_pgjobs.exceptions.TooManySteps"
    assert "MAX_STEPS" in ran.error["message"]
    assert len(_steps(job.id)) == 3


def test_a_repeated_step_name_is_keyed_by_its_occurrence() -> None:
    job = durable_jobs.many_steps.enqueue(3)
    [ran] = run_jobs()
    assert ran.status == "completed"
    assert [(s[1], s[2]) for s in _steps(job.id)] == [("tick", 0), ("tick", 1), ("tick", 2)]


def test_a_pruned_job_takes_its_steps_along() -> None:
    job = durable_jobs.many_steps.enqueue(2)
    run_jobs()
    assert JobStep.objects.filter(job_id=job.id).count() == 2
    Job.objects.filter(id=job.id).update(finished_at=timezone.now() - timedelta(days=30))
    assert Pruner().run_once()["by_status"]["completed"] == 1
    assert JobStep.objects.filter(job_id=job.id).count() == 0


def test_a_waiting_job_counts_against_no_queue_limit() -> None:
    Queue.objects.create(name="durable", max_running=1, rate="2/h")
    sleeper = durable_jobs.three_steps.enqueue(1)
    other = durable_jobs.many_steps.enqueue(1)
    ran = {r.id: r.status for r in run_jobs()}
    # the sleeper's start took one of the two starts of the hour; parked, it holds no
    # running slot, so the other job of the queue runs in the same drain
    assert ran == {sleeper.id: "waiting", other.id: "completed"}


def test_a_waiting_job_frees_its_concurrency_key() -> None:
    first = flow_keyed_jobs.durable_keyed_sleeper.enqueue(1, 3600)
    second = flow_keyed_jobs.durable_keyed_sleeper.enqueue(1, 0)
    ran = {r.id: r.status for r in run_jobs()}
    assert ran == {first.id: "waiting", second.id: "completed"}
    [woke] = run_jobs(advance=timedelta(hours=1))
    assert (woke.id, woke.status, woke.value) == (first.id, "completed", "woke")


def test_a_waiting_workflow_node_keeps_its_dependents_blocked_until_it_completes() -> None:
    run = chain(durable_jobs.three_steps.s(1), durable_jobs.many_steps.si(1)).enqueue()
    sleeper, after = run.jobs
    assert {r.id: r.status for r in run_jobs()} == {sleeper.id: "waiting"}
    assert Job.objects.get(id=after.id).status == "blocked"
    ran = {r.id: r.status for r in run_jobs(advance=timedelta(hours=1))}
    assert ran == {sleeper.id: "completed", after.id: "completed"}


def test_cancelling_a_workflow_cancels_its_waiting_nodes() -> None:
    run = chain(durable_jobs.three_steps.s(1), durable_jobs.many_steps.si(1)).enqueue()
    sleeper, after = run.jobs
    run_jobs()
    assert run.cancel() == 2
    assert {j.id: j.status for j in Job.objects.filter(id__in=[sleeper.id, after.id])} == {
        sleeper.id: "cancelled",
        after.id: "cancelled",
    }
    assert run_jobs(advance=timedelta(hours=1)) == []


def test_a_sleep_in_an_atomic_job_is_dead_with_a_clear_error_and_records_nothing() -> None:
    job = durable_jobs.atomic_sleeper.enqueue()
    [ran] = run_jobs()
    assert ran.status == "dead"
    assert ran.error is not None
    assert ran.error["type"] == "django_pgjobs.durable.control.ParkedInAtomicJob"
    assert "atomic_step" in ran.error["message"]
    assert _steps(job.id) == []  # rolled back with the job's one transaction
