"""Scenario 3: the reaper and a finishing worker act on the same job at once.

Each round makes a batch of jobs that are running *and* stale, then releases
three threads at one barrier, each on its own connection, running the product's
own statements: a completer (``complete_many`` with the claimed lease), a reaper
(``reap``) and a re-claimer (``claim``, picking up whatever the reaper freed).
Afterwards every job was either completed by its owner or reclaimed — never
both — and the row agrees with what each statement reported.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import psycopg

from django_pgjobs import claim
from django_pgjobs.db.job_outcome import job_complete_many
from django_pgjobs.db.reap import job_reap_stale
from tests.faults.conftest import DBNAME

ROUNDS = 60
JOBS_PER_ROUND = 20
WORKER_LOST = "django_pgjobs.exceptions.WorkerLost"


def make_stale_running(db: psycopg.Connection, n: int) -> list[int]:
    rows = db.execute(
        "INSERT INTO django_pgjobs_job (task, args, kwargs, max_attempts, status, attempts,"
        " lease, worker, started_at, heartbeat_at)"
        " SELECT 'tests.testapp.jobs.noop', '[]', '{}', 5, 'running', 1, 1, 'old',"
        " now() - interval '1 minute', now() - interval '1 minute'"
        " FROM generate_series(1, %s) RETURNING id",
        [n],
    ).fetchall()
    return [r[0] for r in rows]


def test_reaper_and_completer_never_both_win(db, cluster) -> None:
    dsn = cluster.dsn(DBNAME)
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(3)]
    rng = random.Random(8)
    wins = {"completed": 0, "reaped": 0}
    try:
        for _ in range(ROUNDS):
            db.execute(
                "TRUNCATE django_pgjobs_job, django_pgjobs_jobstep, django_pgjobs_jobresult, django_pgjobs_jobdependency,"
                " django_pgjobs_jobsignal"
            )
            ids = make_stale_running(db, JOBS_PER_ROUND)
            rng.shuffle(ids)
            results = race_round(conns, ids, rng)
            completed, reaped = results["completed"], results["reaped"]
            reclaimed: dict[int, int] = results["reclaimed"]
            assert not completed & reaped, "a job was both completed and reclaimed"
            assert completed | reaped == set(ids)
            assert set(reclaimed) <= reaped
            wins["completed"] += len(completed)
            wins["reaped"] += len(reaped)
            rows = {
                r[0]: r
                for r in db.execute(
                    "SELECT id, status, lease, errors, finished_at,"
                    " (SELECT count(*) FROM django_pgjobs_jobresult r WHERE r.job_id = j.id)"
                    " FROM django_pgjobs_job j"
                ).fetchall()
            }
            for i in completed:
                _, status, lease, errs, finished_at, nresults = rows[i]
                assert (status, lease, errs, nresults) == ("completed", 1, [], 1)
                assert finished_at is not None
            for i in reaped:
                _, status, lease, errs, finished_at, nresults = rows[i]
                assert [e["type"] for e in errs] == [WORKER_LOST]
                assert nresults == 0 and finished_at is None
                if i in reclaimed:
                    assert (status, lease) == ("running", 3) and reclaimed[i] == 3
                else:
                    assert (status, lease) == ("pending", 2)
    finally:
        for c in conns:
            c.close()
    assert wins["completed"] and wins["reaped"], f"the race never went both ways: {wins}"


def race_round(
    conns: list[psycopg.Connection], ids: list[int], rng: random.Random
) -> dict[str, Any]:
    """Release a completer, a reaper and a re-claimer at one barrier."""
    barrier = threading.Barrier(3)
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def complete() -> None:
        barrier.wait()
        done: set[int] = set()
        for chunk in (ids[: len(ids) // 2], ids[len(ids) // 2 :]):
            done |= job_complete_many(conns[0], [(i, 1, {"id": i}) for i in chunk])
        results["completed"] = done

    def reap() -> None:
        barrier.wait()
        rows = job_reap_stale(conns[1], stale_after=2.0, batch=rng.randint(1, JOBS_PER_ROUND))
        rows += job_reap_stale(conns[1], stale_after=2.0, batch=JOBS_PER_ROUND)
        results["reaped"] = {r[0] for r in rows}

    def reclaim() -> None:
        barrier.wait()
        got: dict[int, int] = {}
        for _ in range(3):
            for c in claim.claim(conns[2], worker="new", queues=None, n=5):
                got[c.id] = c.lease
        results["reclaimed"] = got

    threads = [threading.Thread(target=_guard(f, errors)) for f in (complete, reap, reclaim)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def _guard(f: Any, errors: list[BaseException]) -> Any:
    def run() -> None:
        try:
            f()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    return run
