"""Flow control without worker processes: options and their errors, the queue rows
and their sync, pause/resume, the limited claim statement, unique_while, deploy skew
(the unknown-task sweeper, the discovery hint) and the claim plans."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from django_pgjobs import pause_queue, resume_queue
from django_pgjobs.claim import UNBOUNDED, claim_statements
from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.claim.plain import pending_queues
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.claim.run import claim as run_claim
from django_pgjobs.db.job_outcome import job_complete_many
from django_pgjobs.db.tables import QUEUE
from django_pgjobs.db.workers import unknown_pending
from django_pgjobs.jobs import registry
from django_pgjobs.maintenance.unknown_tasks import UnknownTaskSweeper
from django_pgjobs.models import Job, KnownTask, Queue
from django_pgjobs.models import Worker as WorkerRow
from django_pgjobs.queues import sync_queues
from tests import flow_jobs, flow_keyed_jobs
from tests.helpers.plans import fill_jobs
from tests.testapp import jobs

db = pytest.mark.django_db


def claim(n: int = 10, queues: list[str] | None = None, **kw: Any) -> list[Claimed]:
    return run_claim(connection, worker="w", queues=queues, n=n, **kw)


def known() -> list[str]:
    return [d.name for d in registry.all_definitions()]


# -- options and their errors ---------------------------------------------------------


@db
def test_concurrency_key_from_positional_args_and_callables() -> None:
    row = flow_keyed_jobs.per_user.enqueue(42, 1, 0)
    assert (row.concurrency_key, row.concurrency_limit) == ("user:42", 1)
    stored = Job.objects.get(id=row.id)
    assert (stored.concurrency_key, stored.concurrency_limit) == ("user:42", 1)
    row = flow_keyed_jobs.per_user.enqueue(user_id=7, i=2, seconds=0)
    assert Job.objects.get(id=row.id).concurrency_key == "user:7"
    assert flow_keyed_jobs.per_user.enqueue_many([(1, 1, 0), (2, 2, 0)]) == 2
    assert sorted(
        Job.objects.filter(concurrency_key__in=["user:1", "user:2"]).values_list(
            "concurrency_key", flat=True
        )
    ) == ["user:1", "user:2"]
    by_callable = registry.get("tests.flow_keyed_jobs.by_account")
    row = Job.objects.enqueue(by_callable.name, args=[{"account": "acme"}])
    assert Job.objects.get(id=row.id).concurrency_key == "acct-acme"
    assert Job.objects.get(id=row.id).concurrency_limit == 3


@db
def test_a_key_that_cannot_be_built_writes_nothing() -> None:
    with pytest.raises(ValueError, match=r"concurrency_key of tests\.flow_keyed_jobs\.by_account"):
        Job.objects.enqueue("tests.flow_keyed_jobs.by_account", args=[{}])
    assert not Job.objects.exists()


@db
def test_unique_key_needs_unique_while_and_enqueue_many_refuses_unique_jobs() -> None:
    with pytest.raises(TypeError, match="needs @job\\(unique_while"):
        jobs.noop.using(unique_key="x").enqueue()
    with pytest.raises(ValueError, match="unique_key must be a non-empty string"):
        flow_jobs.refresh_account.using(unique_key="")
    with pytest.raises(ValueError, match="enqueue_many cannot enqueue"):
        flow_jobs.refresh_account.enqueue_many([(1,), (2,)])
    assert not Job.objects.exists()


# -- unique_while ------------------------------------------------------------------


@db
def test_unique_while_active_returns_the_existing_job_until_it_finishes() -> None:
    first = flow_jobs.refresh_account.enqueue(1)
    again = flow_jobs.refresh_account.enqueue(1)
    other = flow_jobs.refresh_account.enqueue(2)  # other arguments: another key
    assert again.id == first.id and other.id != first.id
    assert Job.objects.count() == 2
    claimed = [c for c in claim(tasks=known()) if c.id == first.id]
    assert claimed  # running still holds an "active" key
    assert flow_jobs.refresh_account.enqueue(1).id == first.id
    job_complete_many(connection, [(first.id, claimed[0].lease, None)])
    fresh = flow_jobs.refresh_account.enqueue(1)  # finished: the key is free again
    assert fresh.id != first.id
    keyed = flow_jobs.refresh_account.using(unique_key="acct")
    assert keyed.enqueue(5).id == keyed.enqueue(6).id  # an explicit key, whatever the args


@db
def test_unique_while_pending_frees_the_key_when_the_job_starts() -> None:
    first = flow_jobs.rebuild_index.enqueue("a")
    assert flow_jobs.rebuild_index.enqueue("a").id == first.id
    assert Job.objects.get(id=first.id).unique_key.startswith("pending:")
    claim(queues=["flow-unique"], tasks=known())
    assert Job.objects.get(id=first.id).unique_key is None
    second = flow_jobs.rebuild_index.enqueue("a")  # running does not hold a pending key
    assert second.id != first.id


# -- queue rows, sync, pause/resume -----------------------------------------------------


@db
def test_settings_are_synced_into_queue_rows_and_keep_runtime_pauses(settings: Any) -> None:
    Queue.objects.create(name="emails", paused=True, max_running=9)
    settings.PGJOBS = {
        **settings.PGJOBS,
        "QUEUES": {"emails": {"max_running": 5, "rate": "100/m"}, "reports": {"paused": True}},
    }
    assert sync_queues() == 2
    rows = {q.name: (q.paused, q.max_running, q.rate) for q in Queue.objects.all()}
    assert rows == {"emails": (True, 5, "100/m"), "reports": (True, None, None)}


@pytest.mark.django_db(transaction=True)
def test_migrate_syncs_the_queues_setting(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "QUEUES": {"bulk": {"max_running": 3}}}
    call_command("migrate", "django_pgjobs", verbosity=0)
    assert Queue.objects.get(name="bulk").max_running == 3


@db
def test_pause_and_resume_commands_and_functions() -> None:
    call_command("pause_queue", "a", "b", "--create", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert set(Queue.objects.filter(paused=True).values_list("name", flat=True)) == {"a", "b"}
    resume_queue("a")  # known now: it has a row
    assert list(Queue.objects.filter(paused=True).values_list("name", flat=True)) == ["b"]
    assert pause_queue("c", create=True) == ["c"]
    with pytest.raises(CommandError, match="queue must not contain commas"):
        call_command("resume_queue", "x,y")
    assert not Queue.objects.filter(name__contains=",").exists()


@db
def test_paused_queue_is_skipped_by_the_fast_and_the_limited_claim() -> None:
    held = flow_jobs.held.enqueue(1)
    flowing = flow_jobs.flowing.enqueue(1)
    pause_queue("flow-held")
    names = [flow_jobs.held.name, flow_jobs.flowing.name]
    state = Claimant(["flow-held", "flow-flowing"], names, worker="w")
    options = state.claim_options(connection)
    assert options["limited"] is False and options["queues"] == ["flow-flowing"]
    assert [c.id for c in state.take(connection, 10)] == [flowing.id]
    everywhere = Claimant(None, names, worker="w")
    assert everywhere.claim_options(connection)["limited"] is True
    assert everywhere.take(connection, 10) == []
    resume_queue("flow-held")
    everywhere.invalidate()
    assert [c.id for c in everywhere.take(connection, 10)] == [held.id]


# -- the limited claim statement ---------------------------------------------------------


@db
def test_limited_claim_counts_running_jobs_and_keys() -> None:
    Queue.objects.create(name="flow-limited", max_running=3)
    ids = [flow_jobs.limited.enqueue(i, 0).id for i in range(5)]
    first = claim(queues=["flow-limited"], tasks=known(), limited=True)
    assert [c.id for c in first] == ids[:3]
    assert claim(queues=["flow-limited"], tasks=known(), limited=True) == []
    job_complete_many(connection, [(first[0].id, first[0].lease, None)])
    assert [c.id for c in claim(tasks=known(), limited=True)] == [ids[3]]
    # keys: one per key at a time, later keys are not stalled behind a blocked one
    a1, a2, b1 = (flow_keyed_jobs.per_user.enqueue(u, i, 0).id for u, i in ((1, 1), (1, 2), (2, 1)))
    got = [c.id for c in claim(queues=["flow-keyed"], tasks=known(), limited=True)]
    assert got == [a1, b1]
    assert claim(queues=["flow-keyed"], tasks=known(), limited=True) == []
    assert Job.objects.get(id=a2).status == "pending"


@db
def test_limited_claim_rate_window() -> None:
    Queue.objects.create(name="flow-rated", rate="3/m")
    ids = [flow_jobs.rated.enqueue(i).id for i in range(5)]
    assert len(claim(n=2, queues=["flow-rated"], tasks=known(), limited=True)) == 2
    assert len(claim(n=5, queues=["flow-rated"], tasks=known(), limited=True)) == 1
    assert claim(n=5, queues=["flow-rated"], tasks=known(), limited=True) == []
    assert len(Queue.objects.get(name="flow-rated").rate_log) == 3
    # A minute later the window has moved on.
    Queue.objects.filter(name="flow-rated").update(
        rate_log=[(timezone.now() - timedelta(seconds=61)).timestamp()] * 3
    )
    assert len(claim(n=5, queues=["flow-rated"], tasks=known(), limited=True)) == 2
    assert Job.objects.filter(id__in=ids, status="running").count() == 5


# -- deploy skew --------------------------------------------------------------------------


@db
def test_claims_skip_tasks_the_worker_does_not_know() -> None:
    unknown = jobs.noop.enqueue()
    Job.objects.filter(id=unknown.id).update(task="tests.next_release.job")
    known_job = jobs.noop.enqueue()
    for limited in (False, True):
        got = claim(tasks=known(), limited=limited)
        assert unknown.id not in [c.id for c in got]
    assert Job.objects.get(id=known_job.id).status == "running"
    assert Job.objects.get(id=unknown.id).attempts == 0


@db
def test_fast_path_gives_back_an_unknown_task_uncounted_then_filters() -> None:
    unknown = jobs.noop.using(priority=5).enqueue()
    Job.objects.filter(id=unknown.id).update(task="tests.next_release.job")
    ours = jobs.noop.enqueue()
    state = Claimant(["default"], [jobs.noop.name], worker="w")
    assert state.claim_options(connection)["tasks"] is None  # the plain claim, unfiltered
    assert [c.id for c in state.take(connection, 1)] == []
    row = Job.objects.get(id=unknown.id)
    assert (row.status, row.attempts, row.lease) == ("pending", 0, 1)  # given back, uncounted
    assert state.skew_seen and state.claim_options(connection)["tasks"] == (jobs.noop.name,)
    assert [c.id for c in state.take(connection, 5)] == [ours.id]
    assert Job.objects.get(id=unknown.id).status == "pending"


@db
@pytest.mark.parametrize("notified", [True, False], ids=["listen", "no-listen"])
def test_a_worker_of_every_queue_claims_from_the_queues_with_pending_jobs(
    notified: bool,
) -> None:
    """It claims by name from PENDING_QUEUES (one walk of the claim index per
    claim, not two) and still finds a queue that gets its first job: announced by
    a NOTIFY (LISTEN), or re-read after an empty claim (no LISTEN)."""
    state = Claimant(None, [jobs.noop.name], refresh=3600, notified=notified, worker="w")
    a = jobs.noop.using(queue="a").enqueue()
    assert state.claim_options(connection)["queues"] == ["a"]
    assert [c.id for c in state.take(connection, 5)] == [a.id]
    b = jobs.noop.using(queue="b").enqueue()
    if notified:
        # Within the refresh interval the list is kept: only the NOTIFY's queue
        # name tells the worker about "b".
        assert state.take(connection, 5) == []
        state.saw_queue("a")  # a NOTIFY of a queue it has: nothing to re-read
        assert state.take(connection, 5) == []
        state.saw_queue("b")
    else:
        assert state.take(connection, 5) == []  # empty: re-read next time
    assert [c.id for c in state.take(connection, 5)] == [b.id]
    # The NOTIFY added "b" to the list, unread ("a" stays until the next refresh); an
    # empty claim without LISTEN read it again.
    assert state.pending == (["a", "b"] if notified else ["b"])
    assert pending_queues(connection) == []  # both claimed


@db
def test_sweeper_dead_letters_only_after_the_timeout(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "UNKNOWN_TASK_TIMEOUT": 60}
    waiting = jobs.noop.enqueue()
    old = jobs.noop.enqueue()
    Job.objects.filter(id__in=[waiting.id, old.id]).update(task="tests.gone.job")
    Job.objects.filter(id=old.id).update(run_at=timezone.now() - timedelta(seconds=120))
    WorkerRow.objects.create(
        id="w1",
        host="h",
        pid=1,
        queues=["*"],
        concurrency=1,
        tasks=[jobs.noop.name],
        started_at=timezone.now() - timedelta(hours=1),
    )
    assert [u["task"] for u in unknown_pending(connection, stale_after=30)] == ["tests.gone.job"]
    assert UnknownTaskSweeper(alias="default").run_once() == {"dead": 1}
    dead = Job.objects.get(id=old.id)
    assert (
        dead.status == "dead" and dead.errors[0]["type"] == "django_pgjobs.exceptions.UnknownTask"
    )
    assert "unknown task 'tests.gone.job'" in dead.last_error and "JOB_MODULES" in dead.last_error
    assert Job.objects.get(id=waiting.id).status == "pending"
    assert KnownTask.objects.filter(name=jobs.noop.name).exists()


@db
def test_sweeper_spares_a_task_a_worker_knew_recently(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "UNKNOWN_TASK_TIMEOUT": 60}
    row = jobs.noop.enqueue()
    Job.objects.filter(id=row.id).update(
        task="tests.rolled_back.job", run_at=timezone.now() - timedelta(seconds=120)
    )
    KnownTask.objects.create(name="tests.rolled_back.job", last_known=timezone.now())
    WorkerRow.objects.create(
        id="w1",
        host="h",
        pid=1,
        queues=["*"],
        concurrency=1,
        tasks=[],
        started_at=timezone.now() - timedelta(hours=1),
    )
    assert UnknownTaskSweeper(alias="default").run_once() == {"dead": 0}
    # ...and nothing happens while the only live worker has been up less than the timeout.
    KnownTask.objects.all().delete()
    WorkerRow.objects.update(started_at=timezone.now())
    assert UnknownTaskSweeper(alias="default").run_once() == {"dead": 0}


# -- plans ------------------------------------------------------------------------------


def _plan(statement: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        value = cur.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


@db
@pytest.mark.parametrize(
    ("statement", "extra"),
    [
        (claim_statements()["JOB_CLAIM_ONE_QUEUE_KNOWN"], {"queue": "default"}),
        (claim_statements()["JOB_CLAIM_QUEUES_KNOWN"], {"queues": ["default", "emails"]}),
        (claim_statements()["JOB_CLAIM_ALL_KNOWN"], {}),
    ],
    ids=["one-queue", "queues", "all"],
)
def test_known_task_claims_are_the_fast_path_plus_a_filter(statement: str, extra: dict) -> None:

    fill_jobs(20_000, 1000)
    # A prepared statement's generic plan knows nothing of the array; a custom plan
    # sees that 'history' dominates the column and 'live' is rare: neither may trade
    # the ordered index scan for a bitmap scan and a sort.
    plan = _plan(
        statement,
        {"worker": "w", "n": 100, "since": UNBOUNDED, "tasks": ["live", "x"], **extra},
    )
    assert "pgjobs_job_claim_idx" in plan, plan
    assert '"Node Type": "Seq Scan"' not in plan and "Bitmap Heap Scan" not in plan, plan
    # no join to the queue table, no advisory lock: only the task filter was added
    assert QUEUE not in statement and "advisory" not in statement


# -- admin ----------------------------------------------------------------------------


@db
def test_queue_admin_lists_edits_pauses_and_resumes(admin_client: Any) -> None:
    flow_jobs.held.enqueue(1)
    Queue.objects.create(name="flow-held", max_running=2)
    url = "/admin/django_pgjobs/queue/"
    page = admin_client.get(url)
    assert page.status_code == 200 and b"flow-held" in page.content
    response = admin_client.post(url, {"action": "pause", "_selected_action": ["flow-held"]})
    assert response.status_code == 302
    assert Queue.objects.get(name="flow-held").paused
    admin_client.post(url, {"action": "resume", "_selected_action": ["flow-held"]})
    assert not Queue.objects.get(name="flow-held").paused
    bad = admin_client.post(f"{url}add/", {"name": "new", "rate": "10/d", "max_running": ""})
    assert bad.status_code == 200 and b"rate must be" in bad.content
    assert not Queue.objects.filter(name="new").exists()
    good = admin_client.post(f"{url}add/", {"name": "new", "rate": "10/m", "max_running": "3"})
    assert good.status_code == 302
    assert Queue.objects.filter(name="new", rate="10/m", max_running=3).exists()


@db
def test_job_admin_filter_shows_jobs_no_live_worker_knows(admin_client: Any) -> None:
    waiting = jobs.noop.enqueue()
    Job.objects.filter(id=waiting.id).update(task="tests.next_release.job")
    known_job = jobs.noop.enqueue()
    WorkerRow.objects.create(
        id="w1", host="h", pid=1, queues=["*"], concurrency=1, tasks=[jobs.noop.name]
    )
    page = admin_client.get("/admin/django_pgjobs/job/?attention=unknown")
    assert page.status_code == 200
    ids = [j.id for j in page.context["cl"].result_list]
    assert ids == [waiting.id] and known_job.id not in ids
