"""The claim: one statement, claim-index order, SKIP LOCKED, never a job twice."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_pgjobs import claim
from django_pgjobs.claim.limited import job_claim_limited
from django_pgjobs.claim.rows import Claimed, from_rows
from django_pgjobs.db.cursor import int_array, text_array
from django_pgjobs.db.job_outcome import job_complete_many
from django_pgjobs.db.tables import JOB
from django_pgjobs.models import Job, JobResult
from django_pgjobs.states import JobStatus
from tests.conftest import dsn
from tests.helpers.rows import make_job
from tests.testapp import jobs


def _ids(claimed: list[Claimed]) -> list[int]:
    return [c.id for c in claimed]


@pytest.mark.django_db
def test_claim_takes_at_most_n_in_priority_then_age_order() -> None:
    low = make_job(priority=-5, run_at_delta=-30)
    old = make_job(priority=0, run_at_delta=-20)
    new = make_job(priority=0, run_at_delta=-10)
    high = make_job(priority=50, run_at_delta=-1)
    same_time = [make_job(priority=0, run_at_delta=-5) for _ in range(2)]
    Job.objects.filter(id__in=[j.id for j in same_time]).update(run_at=new.run_at)

    # The batch is the best n, by priority then id (the worker starts them in this
    # order; RETURNING's own order is the heap's, and `high` was written last).
    first = claim.claim(connection, worker="w", queues=["default"], n=3)
    assert _ids(first) == [high.id, old.id, new.id]
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 3
    # One at a time shows the order: ties on run_at are broken by id.
    rest = [_ids(claim.claim(connection, worker="w", queues=["default"], n=1)) for _ in range(4)]
    assert rest == [[i] for i in sorted(j.id for j in same_time)] + [[low.id], []]
    c = next(c for c in first if c.id == high.id)
    assert (c.attempt, c.lease, c.task, c.args, c.kwargs) == (
        1,
        1,
        "tests.testapp.jobs.add",
        [1, 2],
        {},
    )


@pytest.mark.django_db
def test_claim_returns_what_the_worker_needs() -> None:
    job = jobs.send_email.using(idempotency_key="claim-k").enqueue("a@b.c", subject="x")
    Job.objects.filter(id=job.id).update(run_at=job.run_at.replace(year=2000))
    [c] = claim.claim(connection, worker="w", queues=["emails"], n=5)
    assert c == Claimed(
        job.id,
        "tests.testapp.jobs.send_email",
        ["a@b.c"],
        {"subject": "x"},
        1,
        3,
        1,
        "emails",
        5,
        "claim-k",
        run_at_us=c.run_at_us,
    )
    assert c.run_at == job.run_at.replace(year=2000)
    assert c.run_at is not None and c.run_at.microsecond == job.run_at.microsecond


@pytest.mark.django_db
@pytest.mark.parametrize("run_at", ["-infinity", "0044-03-15 12:00 BC"])
def test_a_run_at_python_cannot_hold_is_claimed_without_one(run_at: str) -> None:
    """The claim returns run_at as epoch microseconds (Django's loader parses text in
    Python); one no datetime can hold (only raw SQL writes it) is None, and the claim
    still hands the job out. The limited claim reads the index without a bound on
    run_at, so it reaches such a row (the bounded claims start at year 1)."""
    job = jobs.send_email.enqueue("a@b.c")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {JOB} SET run_at = %s::timestamptz WHERE id = %s", [run_at, job.id])
    [c] = job_claim_limited(connection, worker="w", queues=["emails"], n=5, tasks=None)
    assert (c.id, c.run_at, c.lease) == (job.id, None, 1)


@pytest.mark.django_db
@pytest.mark.parametrize("queues", [["a", "b"], None], ids=["JOB_CLAIM_QUEUES", "JOB_CLAIM_ALL"])
def test_multi_queue_claims_filter_queues_and_honour_priority(queues: list[str] | None) -> None:
    for q in ("a", "b", "c"):
        for p in (1, 9, 5):
            make_job(queue=q, priority=p, run_at_delta=-p - 10)
    make_job(queue="a", priority=7, run_at_delta=3600)  # not due
    wanted = ("a", "b") if queues else ("a", "b", "c")
    # A batch takes the best n across the queues...
    best = claim.claim(connection, worker="w", queues=queues, n=len(wanted))
    assert sorted((c.queue, c.priority) for c in best) == [(q, 9) for q in wanted]
    # ...and one at a time, each queue is served strictly by priority.
    order = []
    while claimed := claim.claim(connection, worker="w", queues=queues, n=1):
        order.append((claimed[0].queue, claimed[0].priority))
    assert sorted({q for q, _ in order}) == list(wanted)
    assert [p for _, p in order] == [5] * len(wanted) + [1] * len(wanted)
    assert Job.objects.filter(status=JobStatus.PENDING).count() == (1 if queues is None else 4)


@pytest.mark.django_db
@pytest.mark.parametrize("queues", [["a"], ["a", "b"], None])
def test_multi_queue_claim_limit_is_global(queues: list[str] | None) -> None:
    for q in ("a", "b"):
        for _ in range(5):
            make_job(queue=q)
    assert len(claim.claim(connection, worker="w", queues=queues, n=3)) == 3
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    "statement,params",
    [
        (claim.claim_statements()["JOB_CLAIM_ONE_QUEUE"], {"queue": "q7"}),
        (claim.claim_statements()["JOB_CLAIM_QUEUES"], {"queues": ["q3", "q7"]}),
        (claim.claim_statements()["JOB_CLAIM_ALL"], {}),
    ],
    ids=["one", "queues", "all"],
)
def test_claim_plan_uses_the_partial_claim_index(statement: str, params: dict[str, Any]) -> None:
    # Realistic shape: a long finished history and a little live work.
    jobs.add.enqueue_many([(i, i) for i in range(3000)])
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB} SET status = 'completed', finished_at = now(), queue = 'q' || (id % 10)"
        )
    jobs.add.using(queue="q7").enqueue_many([(i, i) for i in range(20)])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {JOB}")
        cursor.execute(
            "EXPLAIN " + statement, {"worker": "w", "n": 10, "since": claim.UNBOUNDED, **params}
        )
        plan = "\n".join(r[0] for r in cursor.fetchall())
    assert "pgjobs_job_claim_idx" in plan, plan
    assert "Seq Scan on django_pgjobs_job" not in plan, plan


def _claimer(
    queues: list[str] | None, seen: list[int], errors: list[BaseException], start: threading.Barrier
) -> None:
    """A worker on its own psycopg connection, claiming random batch sizes until empty."""
    try:
        with psycopg.connect(dsn(), autocommit=True) as conn:
            start.wait()
            empty = 0
            while empty < 3:
                if queues is None:
                    statement, params = claim.claim_statements()["JOB_CLAIM_ALL"], {}
                elif len(queues) == 1:
                    statement, params = (
                        claim.claim_statements()["JOB_CLAIM_ONE_QUEUE"],
                        {"queue": queues[0]},
                    )
                else:
                    statement, params = (
                        claim.claim_statements()["JOB_CLAIM_QUEUES"],
                        {"queues": queues},
                    )
                rows = conn.execute(
                    statement,
                    {
                        "worker": threading.current_thread().name,
                        "n": random.randint(1, 25),
                        "since": claim.UNBOUNDED,
                        **params,
                    },
                ).fetchall()
                seen.extend(r[0] for r in rows)
                empty = 0 if rows else empty + 1
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "queues", [["default"], ["default", "other"], None], ids=["one", "queues", "all"]
)
def test_concurrent_claimers_never_claim_a_job_twice(queues: list[str] | None) -> None:
    jobs.add.enqueue_many([(i, i) for i in range(1500)])
    jobs.add.using(queue="other").enqueue_many([(i, i) for i in range(500)])
    expected = Job.objects.filter(queue__in=queues) if queues else Job.objects.all()
    expected_ids = set(expected.values_list("id", flat=True))

    seen: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)
    threads = [
        threading.Thread(target=_claimer, args=(queues, seen, errors, start), name=f"claimer-{i}")
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    dupes = [i for i, n in Counter(seen).items() if n > 1]
    assert dupes == []
    assert set(seen) == expected_ids
    # The rows agree: each claimed exactly once, by the thread that got it.
    assert set(
        Job.objects.filter(id__in=expected_ids).values_list("attempts", "lease", "status")
    ) == {(1, 1, JobStatus.RUNNING)}


@pytest.mark.django_db(transaction=True)
def test_a_claim_on_a_plain_psycopg_connection_decodes_each_row_on_its_own() -> None:
    """psycopg decodes jsonb at fetch time on a plain connection, where one undecodable
    row would raise for the whole batch after the claim committed."""
    deep = "(repeat('[', 3000) || repeat(']', 3000))::jsonb"
    hostile, mate = jobs.add.enqueue(1, 2), jobs.add.enqueue(3, 4)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB} SET args = {deep}, trace_context = {deep} WHERE id = %s", [hostile.id]
        )
    with psycopg.connect(dsn(), autocommit=True) as conn:
        claimed = claim.claim(conn, worker="plain", queues=["default"], n=10)
    by_id = {c.id: c for c in claimed}
    assert set(by_id) == {hostile.id, mate.id}
    assert by_id[mate.id].args == [3, 4]
    assert by_id[hostile.id].args == "<undecodable: RecursionError>"
    assert by_id[hostile.id].trace_context is None


@pytest.mark.django_db
def test_completion_arrays_sent_as_literals_round_trip_any_value() -> None:
    """The completion sends its ids, leases and values as array literals (psycopg
    dumps a list element by element in Python); quotes, backslashes, braces, commas
    and the word NULL inside a value come back as they went in, a None stores none."""
    values: list[Any] = ['a"b\\c', {"k": ["{}", ",", "NULL", "\\\\", '"']}, "NULL", "", None, [1]]
    made = [jobs.noop.enqueue() for _ in values]
    claimed = {c.id: c for c in claim.claim(connection, worker="w", queues=None, n=len(values))}
    assert set(claimed) == {j.id for j in made}
    items = [(j.id, claimed[j.id].lease, v) for j, v in zip(made, values, strict=True)]
    assert job_complete_many(connection, items) == {j.id for j in made}
    stored = {r.job_id: r.value for r in JobResult.objects.filter(job_id__in=claimed)}
    assert stored == {j.id: v for j, v in zip(made, values, strict=True) if v is not None}
    assert int_array([]) == "{}"
    assert text_array([None, 'x"\\']) == '{NULL,"x\\"\\\\"}'


def test_a_claimed_batch_comes_back_in_claim_order_whatever_the_rows_order() -> None:
    """UPDATE ... RETURNING gives rows in heap order (CI's embedded server once returned
    [54, 52, 53]); the worker starts a batch in list order, so the list is put in the
    claim's order: priority DESC, run_at, id (no run_at: one Python cannot hold)."""

    def row(job_id: int, priority: int, run_at_us: int | None = 1_000) -> tuple[Any, ...]:
        fields = (job_id, "t", "[]", "{}", 1, 5, 1, "q", priority, None, None, None)
        return (*fields, False, False, run_at_us)

    rows = [row(54, 0), row(52, 0), row(60, 10), row(53, 0, 500), row(51, -5), row(59, 0, None)]
    assert [c.id for c in from_rows(rows)] == [60, 59, 53, 52, 54, 51]
