"""Fair shares without worker processes: the fair key at enqueue, the fair claim's
order (round-robin over keys, priority within a key, weights), and its plans."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.claim.fair import Cursor, job_claim_fair
from django_pgjobs.models import Job, Queue
from tests import fair_jobs
from tests.helpers.fair import FAIR_TASKS, many

db = pytest.mark.django_db


def claimant(**kw: Any) -> Claimant:
    """A claimant of the queue "fair" that knows only the fair test jobs (a worker that
    knows a task with a concurrency key takes the limited claim)."""
    return Claimant(["fair"], FAIR_TASKS, worker="w", refresh=0.0, **kw)


def tenants_in_claim_order(state: Claimant, count: int, n: int = 1) -> list[str]:
    order: list[str] = []
    while len(order) < count:
        claimed = state.take(connection, n)
        if not claimed:
            break
        keys = dict(
            Job.objects.filter(id__in=[c.id for c in claimed]).values_list("id", "fair_key")
        )
        order += [keys[c.id] for c in claimed]
    return order


@db
def test_the_fair_key_is_computed_at_enqueue() -> None:
    a = fair_jobs.tenant_job.enqueue("a", 1)
    b = fair_jobs.by_payload.enqueue({"tenant": "b"})
    plain = fair_jobs.unkeyed.enqueue(1)
    stored = dict(Job.objects.values_list("id", "fair_key"))
    assert stored == {a.id: "tenant:a", b.id: "b", plain.id: ""}
    assert a.fair_key == "tenant:a"
    fair_jobs.tenant_job.enqueue_many([("c", i) for i in range(3)])
    assert (
        list(Job.objects.filter(kwargs={}, args__0="c").values_list("fair_key", flat=True))
        == ["tenant:c"] * 3
    )


@db
def test_claims_interleave_the_keys_one_job_each() -> None:
    for tenant, count in (("a", 6), ("b", 3), ("c", 3)):
        for i in range(count):
            fair_jobs.tenant_job.enqueue(tenant, i)
    order = tenants_in_claim_order(claimant(), 12)
    assert order == [
        *["tenant:a", "tenant:b", "tenant:c"] * 3,
        "tenant:a",
        "tenant:a",
        "tenant:a",
    ]


@db
def test_a_claim_of_several_jobs_takes_one_round_in_order() -> None:
    for tenant in "abc":
        for i in range(4):
            fair_jobs.tenant_job.enqueue(tenant, i)
    order = tenants_in_claim_order(claimant(), 12, n=4)
    assert order == ["tenant:a", "tenant:b", "tenant:c"] * 4


@db
def test_priority_orders_the_jobs_within_a_key() -> None:
    low = [fair_jobs.tenant_job.enqueue("a", i).id for i in range(2)]
    high = fair_jobs.tenant_job.using(priority=5).enqueue("a", 9).id
    other = fair_jobs.tenant_job.enqueue("b", 0).id
    state = claimant()
    taken = [state.take(connection, 1)[0].id for _ in range(4)]
    # a's highest priority first, then b's turn, then a's others in enqueue order
    assert taken == [high, other, *low]


@db
def test_weights_share_the_claims_three_to_one() -> None:
    Queue.objects.create(name="fair", weights={"tenant:a": 3})
    for tenant in "ab":
        many(tenant, 300)
    state = claimant()
    counts: Counter[str] = Counter()
    for n in (1, 4, 7, 10) * 10:  # claims of several sizes, as a worker makes them
        claimed = state.take(connection, n)
        keys = Job.objects.filter(id__in=[c.id for c in claimed]).values_list("fair_key", flat=True)
        counts.update(keys)
    ratio = counts["tenant:a"] / counts["tenant:b"]
    assert 2.7 <= ratio <= 3.3, counts


@db
def test_a_key_with_a_large_backlog_delays_another_by_one_round_at_most() -> None:
    many("a", 500)
    state = claimant()
    assert len(state.take(connection, 10)) == 10  # the rotation is under way
    late = [fair_jobs.tenant_job.enqueue(t, 0).id for t in "bcd"]
    taken = [c.id for c in state.take(connection, 10)]
    assert set(late) <= set(taken), taken


@db
def test_jobs_not_yet_due_and_unknown_tasks_leave_a_key_out_of_the_rotation() -> None:
    fair_jobs.tenant_job.using(delay=timedelta(hours=1)).enqueue("later", 0)
    past = timezone.now() - timedelta(seconds=1)
    Job.objects.create(task="not.known", queue="fair", fair_key="tenant:ghost", run_at=past)
    due = fair_jobs.tenant_job.enqueue("now", 0).id
    assert [c.id for c in claimant().take(connection, 5)] == [due]


@db
def test_a_row_without_a_fair_key_in_a_fair_queue_runs_through_the_plain_claim() -> None:
    keyed = fair_jobs.tenant_job.enqueue("a", 0).id
    past = timezone.now() - timedelta(seconds=1)
    bare = Job.objects.create(task=fair_jobs.unkeyed.name, queue="fair", args=[1], run_at=past).id
    taken = {c.id for c in claimant().take(connection, 5)}
    assert taken == {keyed, bare}


@db
def test_max_running_still_holds_in_a_fair_queue() -> None:
    Queue.objects.create(name="fair", max_running=2)
    for tenant in "abc":
        many(tenant, 5)
    state = claimant()
    assert len(state.take(connection, 10)) == 2
    assert state.take(connection, 10) == []
    assert Job.objects.filter(status="running").count() == 2


@db
def test_a_queue_without_fair_keys_never_runs_the_fair_claim() -> None:
    fair_jobs.unkeyed.using(queue="plain-queue").enqueue(1)
    state = Claimant(["plain-queue"], FAIR_TASKS, worker="w", refresh=0.0)
    with CaptureQueriesContext(connection) as queries:
        assert len(state.take(connection, 5)) == 1
    statements = [q["sql"] for q in queries.captured_queries]
    assert [s for s in statements if "RETURNING j.id" in s], statements  # the claim ran
    assert not [s for s in statements if "picked.in_turn" in s], statements


@db
def test_the_cursor_goes_on_where_the_last_claim_stopped() -> None:
    for tenant in "abc":
        fair_jobs.tenant_job.enqueue(tenant, 0)
    claimed, cursor = job_claim_fair(connection, worker="w", queue="fair", n=2, cursor=Cursor())
    assert cursor == Cursor("tenant:b", 1)
    claimed, cursor = job_claim_fair(connection, worker="w", queue="fair", n=2, cursor=cursor)
    assert [c.kwargs for c in claimed] == [{}] and cursor == Cursor("tenant:c", 1)


@db
def test_the_fair_claim_reads_every_key_through_the_fair_index() -> None:
    """One key holding every row the statistics saw: planned by them alone, a key's
    scan went through the claim index with the key as a filter (for a small key
    enqueued since, past the large key's backlog), and the estimates put the claim
    past jit_above_cost."""
    from django_pgjobs.claim.fair import JOB_CLAIM_FAIR

    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO django_pgjobs_job (task, queue, run_at, fair_key, kwargs)"
            " SELECT 't', 'fair', now() - interval '1 minute', 'large', '{}'"
            " FROM generate_series(1, 30000) g"
        )
        cur.execute("ANALYZE django_pgjobs_job")
        params = {"worker": "w", "queue": "fair", "n": 10, "cursor": "", "used": 0, "tasks": None}
        cur.execute("EXPLAIN (FORMAT JSON) " + JOB_CLAIM_FAIR, params)
        plan = cur.fetchone()[0]
        cur.execute("SHOW jit_above_cost")
        jit_above = float(cur.fetchone()[0])
    text = plan if isinstance(plan, str) else json.dumps(plan)
    assert "pgjobs_job_claim_idx" not in text, text
    assert '"Node Type": "Seq Scan"' not in text, text
    top = (json.loads(text) if isinstance(plan, str) else plan)[0]["Plan"]
    assert top["Total Cost"] < jit_above, top["Total Cost"]


@db
def test_a_limited_fair_queue_still_rotates_over_its_keys() -> None:
    Queue.objects.create(name="fair", max_running=100)  # a limit: the limited claim
    for tenant, count in (("a", 4), ("b", 2), ("c", 2)):
        for i in range(count):
            fair_jobs.tenant_job.enqueue(tenant, i)
    order = tenants_in_claim_order(claimant(), 8)
    assert order == ["tenant:a", "tenant:b", "tenant:c"] * 2 + ["tenant:a", "tenant:a"]


@db
def test_concurrency_keys_hold_in_a_fair_queue_and_the_rotation_goes_on() -> None:
    from tests import flow_keyed_jobs

    task = flow_keyed_jobs.limited_tenant_job
    for tenant in "abc":
        for i in range(3):
            task.enqueue(tenant, i)
    state = Claimant(["fair-limited"], [task.name], worker="w", refresh=0.0)
    first = state.take(connection, 10)
    # one job a tenant (limit 1 per concurrency key), in the rotation's order
    assert [c.args[0] for c in first] == ["a", "b", "c"]
    assert state.take(connection, 10) == []
    Job.objects.filter(id=first[1].id).update(status="completed", finished_at=timezone.now())
    assert [c.args[0] for c in state.take(connection, 10)] == ["b"]


@db
def test_the_job_list_filters_by_fair_key(admin_client: Any) -> None:
    a = [fair_jobs.tenant_job.enqueue("a", i).id for i in range(2)]
    b = fair_jobs.tenant_job.enqueue("b", 0).id
    fair_jobs.unkeyed.enqueue(1)  # the shared key "": no choice of its own
    page = admin_client.get("/admin/django_pgjobs/job/")
    assert page.status_code == 200
    assert b"?fair_key=tenant%3Aa" in page.content and b"?fair_key=tenant%3Ab" in page.content
    filtered = admin_client.get("/admin/django_pgjobs/job/?fair_key=tenant:a")
    assert sorted(j.id for j in filtered.context["cl"].result_list) == a
    assert b not in [j.id for j in filtered.context["cl"].result_list]


@db
def test_the_queue_admin_edits_weights_and_refuses_bad_ones(admin_client: Any) -> None:
    url = "/admin/django_pgjobs/queue/add/"
    fields = {"name": "fair", "rate": "", "max_running": ""}
    bad = admin_client.post(url, {**fields, "weights": '{"tenant:a": 0}'})
    assert bad.status_code == 200 and b"must be from 1 to 1000" in bad.content
    assert not Queue.objects.filter(name="fair").exists()
    good = admin_client.post(url, {**fields, "weights": '{"tenant:a": 3}'})
    assert good.status_code == 302
    assert Queue.objects.get(name="fair").weights == {"tenant:a": 3}


@db
def test_weights_in_the_setting_are_written_to_the_queue_row_and_checked(settings: Any) -> None:
    from django_pgjobs.checks import check_queues
    from django_pgjobs.queues import sync_queues

    settings.PGJOBS = {**settings.PGJOBS, "QUEUES": {"fair": {"weights": {"tenant:a": 3}}}}
    assert check_queues() == []
    sync_queues()
    assert Queue.objects.get(name="fair").weights == {"tenant:a": 3}
    # a job of another task in that queue takes its turn under the key ""
    assert fair_jobs.unkeyed.using(queue="fair").enqueue(1).fair_key == ""
    settings.PGJOBS = {**settings.PGJOBS, "QUEUES": {"fair": {"weights": {"tenant:a": 1.5}}}}
    errors = check_queues()
    assert errors and "['weights']['tenant:a'] must be a whole number" in errors[0].msg


@db
def test_the_fair_wait_gauge_counts_keys_waiting_with_none_running() -> None:
    from django_pgjobs.health import overview
    from django_pgjobs.health.metrics import QueueCollector
    from django_pgjobs.health.queue_stats import QueueStatsRefresher

    assert overview.fair_waits(connection) == {}
    past = timezone.now() - timedelta(seconds=30)
    busy = fair_jobs.tenant_job.using(run_at=past).enqueue("busy", 0)
    fair_jobs.tenant_job.using(run_at=past).enqueue("busy", 1)
    Job.objects.filter(id=busy.id).update(status="running", heartbeat_at=timezone.now())
    assert overview.fair_waits(connection) == {}  # its key is being served
    fair_jobs.tenant_job.using(run_at=timezone.now() - timedelta(seconds=12)).enqueue("idle", 0)
    waits = overview.fair_waits(connection)
    assert set(waits) == {"fair"} and 11 < waits["fair"] < 60
    collector = QueueCollector()
    refresher = QueueStatsRefresher(collector, alias="default", interval=60)
    assert refresher.refresh_once()
    families = {m.name: m for m in collector.collect()}
    values = {
        s.labels["queue"]: s.value for s in families["pgjobs_queue_fair_wait_seconds"].samples
    }
    assert values["fair"] == pytest.approx(waits["fair"], abs=5)


@db
def test_an_every_queue_limited_worker_claims_a_declared_fair_queue_fairly_at_once() -> None:
    # The rows say which queues are fair only every refresh: read while the queue had
    # no keyed job, they must not leave its first backlog to a FIFO claim till then.
    Queue.objects.create(name="fair", max_running=10)
    state = Claimant(None, FAIR_TASKS, worker="w", refresh=3600.0)
    assert state.take(connection, 1) == []  # the rows read: no fair queue yet
    for i in range(4):
        fair_jobs.tenant_job.enqueue("a", i)
    fair_jobs.tenant_job.enqueue("b", 0)
    claimed = state.take(connection, 2)
    keys = dict(Job.objects.values_list("id", "fair_key"))
    assert [keys[c.id] for c in claimed] == ["tenant:a", "tenant:b"]
