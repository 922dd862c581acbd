"""The minute rollup: exact under racing passes and late commits, forgets old
minutes, and the pages that read it stay off the finished jobs.

Real PostgreSQL, real concurrent connections (one per thread); no mocks. The ground
truth is always a plain ``GROUP BY`` over the jobs table.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.db import reports as status_sql
from django_pgjobs.db.tables import JOB, MINUTE, ROLLUP_MARK
from django_pgjobs.maintenance import rollup as rollup_module
from django_pgjobs.maintenance.rollup import RETENTION, Rollup
from django_pgjobs.states import JobStatus
from tests.helpers.admin_rows import OVERVIEW
from tests.helpers.freeze import frozen_after, in_thread
from tests.helpers.rollup import rolled, truth
from tests.helpers.rows import query

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ("a", "b")


def insert_finished(n: int, *, spread_seconds: float, end_ago: float = 2.0) -> None:
    """``n`` jobs finished over ``spread_seconds`` ending ``end_ago`` s ago (in the past:
    committed before any pass looks), in two queues, one in ten dead."""
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, status, run_at, started_at, finished_at,"
            " heartbeat_at, attempts, lease, worker)"
            " SELECT 'tests.testapp.jobs.add', (%(q)s::text[])[1 + g %% 2],"
            " CASE WHEN g %% 10 = 0 THEN 'dead' ELSE 'completed' END,"
            " f - make_interval(secs => 1 + g %% 7), f - interval '0.5 seconds', f, f, 1, 1, 'w'"
            " FROM (SELECT g, now() - make_interval(secs => %(end)s)"
            "              - make_interval(secs => %(spread)s * g / %(n)s) AS f"
            "         FROM generate_series(1, %(n)s) g) s",
            {"q": list(QUEUES), "n": n, "spread": spread_seconds, "end": end_ago},
        )


def insert_running(n: int) -> list[int]:
    return [
        r[0]
        for r in query(
            f"INSERT INTO {JOB} (task, queue, status, run_at, started_at, heartbeat_at,"
            " attempts, lease, worker)"
            " SELECT 'tests.testapp.jobs.add', (%(q)s::text[])[1 + g %% 2], 'running',"
            " now() - interval '3 seconds', now(), now(), 1, 1, 'w'"
            " FROM generate_series(1, %(n)s) g RETURNING id",
            {"q": list(QUEUES), "n": n},
        )
    ]


FINISH = (
    f"UPDATE {JOB} SET status = %(status)s, finished_at = now()"
    " WHERE id = ANY(%(ids)s) AND status = 'running'"
)


def mark() -> tuple[datetime, datetime]:
    rows = query(f"SELECT rolled_from, rolled_to FROM {ROLLUP_MARK} WHERE id = 1")
    return rows[0][0], rows[0][1]


def wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def catch_up_past(moment: datetime) -> None:
    """Passes until the mark is past ``moment`` (it trails now() by a second)."""

    def past() -> bool:
        Rollup(time_budget=None).run_once()
        return mark()[1] > moment

    wait_for(past)


def db_now() -> datetime:
    return query("SELECT now()")[0][0]


def test_racing_passes_count_every_finish_once_across_minute_boundaries() -> None:
    # Five minutes of history (four minute boundaries) committed before any pass...
    insert_finished(3000, spread_seconds=300)
    # ... and jobs finished while two passes race, in small transactions.
    running = insert_running(600)
    stop = threading.Event()
    errors: list[BaseException] = []

    def passes() -> None:
        try:
            while not stop.is_set():
                Rollup(time_budget=None).run_once()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    racers = [threading.Thread(target=passes) for _ in range(2)]
    for t in racers:
        t.start()
    try:
        for i in range(0, len(running), 20):
            with connection.cursor() as cur:
                cur.execute(
                    FINISH,
                    {"status": "dead" if i % 100 == 0 else "completed", "ids": running[i : i + 20]},
                )
    finally:
        stop.set()
        for t in racers:
            t.join(60)
    assert not errors, errors
    catch_up_past(db_now())
    expected = truth()
    assert sum(expected.values()) == 3600
    assert rolled() == expected
    # Minutes before the first finish were never written; the first pass went back a day.
    assert mark()[0] <= min(m for m, _, _ in expected)


def test_a_finish_committed_late_is_counted_once() -> None:
    ids = insert_running(10)
    # A second connection holds a transaction that finishes jobs at its start time...
    late = connections.create_connection("default")
    try:
        late.set_autocommit(False)
        with late.cursor() as cur:
            cur.execute("SELECT now()")
            started = cur.fetchone()[0]
            cur.execute(FINISH, {"status": "completed", "ids": ids})
        # ... while passes run: the mark never passes that transaction's start.
        for _ in range(3):
            Rollup(time_budget=None).run_once()
            assert mark()[1] <= started
        late.commit()
    finally:
        late.close()
    catch_up_past(db_now())
    assert sum(rolled().values()) == 10
    assert rolled() == truth()


def test_old_minutes_are_forgotten_and_the_pages_stay_exact() -> None:
    insert_finished(200, spread_seconds=120)
    catch_up_past(db_now())
    with connection.cursor() as cur:  # minutes from three days ago, as if kept too long
        cur.execute(
            f"UPDATE {ROLLUP_MARK} SET rolled_from = date_trunc('minute', now() - interval '3 days')"
        )
        cur.execute(
            f"INSERT INTO {MINUTE} (minute, queue, status, finished) VALUES"
            " (date_trunc('minute', now() - interval '3 days'), 'a', 'completed', 7)"
        )
    before = db_now()  # the pass's clock is later: a minute boundary may fall between
    catch_up_past(before)
    rolled_from, _ = mark()
    assert rolled_from >= before - RETENTION - timedelta(minutes=1)
    assert not query(f"SELECT 1 FROM {MINUTE} WHERE minute < %s", [rolled_from])
    # The overview's numbers: the minutes plus the live tail equal the jobs table.
    insert_finished(5, spread_seconds=0.1, end_ago=0)  # the live tail, after the mark
    finished = Counter(
        {(q, s): n for q, s, n, _, _ in query(status_sql.STATUS_FINISHED, {"window": 3600.0})}
    )
    direct = Counter(
        {
            (q, s): n
            for q, s, n in query(
                f"SELECT queue, status, count(*) FROM {JOB} WHERE finished_at >="
                " date_trunc('minute', now() - interval '1 hour') GROUP BY 1, 2"
            )
        }
    )
    assert finished == direct and sum(direct.values()) == 205


def _rows_read_from_jobs(plan: Any) -> int:
    """Rows that scans of the jobs table returned, over a whole EXPLAIN ANALYZE plan."""
    node = plan
    total = 0
    if node.get("Relation Name") == JOB:
        total += int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
    for child in node.get("Plans", []):
        total += _rows_read_from_jobs(child)
    return total


def test_the_overview_statements_do_not_read_the_finished_jobs() -> None:
    insert_finished(20_000, spread_seconds=3000)
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {JOB}")
    catch_up_past(db_now())
    for name in (
        "STATUS_FINISHED",
        "STATUS_DEAD_RECENT",
        "FINISHED_PER_MINUTE",
        "CLAIMED_PER_MINUTE",
    ):
        statement = getattr(status_sql, name)
        window = 86400.0 if name == "STATUS_DEAD_RECENT" else 3600.0
        raw = query("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, {"window": window})[0][0]
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
        read = _rows_read_from_jobs(plan)
        assert read < 100, f"{name} read {read} rows of the jobs table"


def test_the_overview_and_jobs_status_make_as_many_queries_whatever_the_throughput(
    admin_client: Client,
) -> None:
    def queries() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as page:
            assert admin_client.get(reverse(OVERVIEW)).status_code == 200
        with CaptureQueriesContext(connection) as command:
            call_command("jobs_status", stdout=io.StringIO())
        return len(page.captured_queries), len(command.captured_queries)

    before = queries()
    insert_finished(5000, spread_seconds=3000)
    catch_up_past(db_now())
    assert queries() == before


@contextlib.contextmanager
def _pass_frozen_before_commit(monkeypatch: Any, *, first_pass: bool) -> Iterator[None]:
    """A real pass, in a thread of its own, held after its last statement and before its
    COMMIT: a worker frozen (SIGSTOP, a paused VM) mid-pass. ``first_pass``: the mark row
    does not exist yet (the pass creates it), else an earlier pass made it."""
    if not first_pass:
        Rollup().run_once()
    assert query(f"SELECT count(*) FROM {ROLLUP_MARK}")[0][0] == (0 if first_pass else 1)

    def until_it_counts() -> None:
        # A pass that finds the mark held by another one skips without counting (and
        # would never reach the freeze): try again until this one holds it.
        deadline = time.monotonic() + 20
        while Rollup().run_once()["skipped"] and time.monotonic() < deadline:
            time.sleep(0.05)

    with frozen_after(monkeypatch, rollup_module, "rollup_minutes", until_it_counts):
        yield


@pytest.mark.parametrize("first_pass", [True, False], ids=["first-pass", "later-pass"])
def test_a_pass_frozen_before_its_commit_holds_no_other_pass(
    monkeypatch: Any, first_pass: bool
) -> None:
    """The other passes skip (the mark is taken) at once. They used to wait for the
    frozen transaction on the mark's insert: after a later pass, ON CONFLICT waited for
    the row's updater; in a first pass, the new row's key was held uncommitted."""
    result: list[dict[str, Any]] = []
    with _pass_frozen_before_commit(monkeypatch, first_pass=first_pass):
        thread = in_thread(lambda: result.append(Rollup().run_once()))
        thread.join(timeout=10)
        done = not thread.is_alive()
    thread.join(timeout=30)  # the frozen worker went on (and a waiting pass ended)
    assert done, "a pass waited for the frozen pass's transaction"
    assert result == [{"counted": 0, "caught_up": False, "skipped": True}]


@pytest.mark.parametrize("first_pass", [True, False], ids=["first-pass", "later-pass"])
def test_a_worker_frozen_mid_pass_does_not_stop_another_worker_reaping(
    monkeypatch: Any, start_worker: Any, first_pass: bool
) -> None:
    """A real runjobs beside a rollup pass frozen before its COMMIT: its maintenance
    thread (the rollup, then the reaper) goes on, and a job whose worker went silent is
    reclaimed."""
    from tests.conftest import wait_until
    from tests.helpers.rows import make_job

    with _pass_frozen_before_commit(monkeypatch, first_pass=first_pass):
        worker = start_worker("--concurrency", "1", "--no-listen")
        wait_until(
            lambda: query("SELECT count(*) FROM django_pgjobs_worker")[0][0] >= 1,
            timeout=60,
            message="the worker registered",
        )
        # Stale only after the worker's first maintenance pass (each service is due
        # within a second of the threads' start, just after the worker row is written):
        # the rollup has met the frozen transaction by the time the reaper could reclaim.
        job = make_job(JobStatus.RUNNING, heartbeat_age=-2.0)
        try:
            wait_until(
                lambda: (
                    query(f"SELECT status FROM {JOB} WHERE id = %s", [job.id])[0][0]
                    != JobStatus.RUNNING
                ),
                timeout=60,
                message="the silent worker's job reclaimed",
            )
        except AssertionError as exc:  # the worker's log as it is at the failure
            raise AssertionError(f"{exc}; worker log:\n{worker.output()[-2000:]}") from None
