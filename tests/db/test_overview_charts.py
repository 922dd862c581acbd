"""The overview's charts: what they count, how they are drawn, that they refresh in
place, and that their queries stay on the indexes at 1,000,000 rows.

Rows are written with plain INSERTs relative to the database's ``now()`` (one
transaction per test, so ``now()`` does not move), so every expected number is exact.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.admin import charts
from django_pgjobs.db.tables import JOB
from django_pgjobs.health import activity, overview
from tests.helpers.admin_rows import OVERVIEW as OVERVIEW_NAME

pytestmark = pytest.mark.django_db
OVERVIEW = reverse(OVERVIEW_NAME)


def insert(
    status: str,
    *,
    queue: str = "default",
    run_ago: float,
    started_ago: float | None,
    finished_ago: float | None,
    n: int = 1,
    task: str = "tests.testapp.jobs.add",
) -> None:
    """``n`` rows; times are seconds before the transaction's now()."""

    def ago(seconds: float | None) -> str:
        return "NULL" if seconds is None else f"now() - make_interval(secs => {seconds})"

    attempts = 0 if started_ago is None else 1
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, status, run_at, created_at, started_at,"
            f" finished_at, heartbeat_at, attempts, lease)"
            f" SELECT %s, %s, %s, {ago(run_ago)}, {ago(run_ago)}, {ago(started_ago)},"
            f" {ago(finished_ago)}, {ago(started_ago)}, {attempts}, {attempts}"
            f" FROM generate_series(1, %s)",
            [task, queue, status, n],
        )


def db_now() -> Any:
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def current(stale_after: float = 30.0) -> tuple[overview.Overview, activity.Activity]:
    ov = overview.overview(connection, stale_after=stale_after)
    oldest = {q.queue: ov.now - q.lag for q in ov.queues if q.lag is not None and q.due}
    return ov, activity.activity(connection, now=ov.now, oldest_due=oldest)


def test_finished_per_minute_by_outcome() -> None:
    insert("completed", run_ago=700, started_ago=610, finished_ago=605, n=3)
    insert("completed", run_ago=200, started_ago=125, finished_ago=125, n=2)
    insert("dead", run_ago=400, started_ago=305, finished_ago=305)
    insert("cancelled", run_ago=200, started_ago=None, finished_ago=130)
    insert("completed", run_ago=5000, started_ago=4000, finished_ago=3900, n=5)  # too old
    ov, data = current()
    assert len(data.minutes) == 61 and data.minutes[-1] == ov.now.replace(second=0, microsecond=0)
    index = {m: i for i, m in enumerate(data.minutes)}

    def minute_of(seconds_ago: float) -> int:
        t = ov.now - timedelta(seconds=seconds_ago)
        return index[t.replace(second=0, microsecond=0)]

    expected = {o: [0] * 61 for o in activity.OUTCOMES}
    expected["completed"][minute_of(605)] += 3
    expected["completed"][minute_of(125)] += 2
    expected["dead"][minute_of(305)] += 1
    expected["cancelled"][minute_of(130)] += 1
    assert data.finished == expected
    assert data.finished_total == {"completed": 5, "dead": 1, "cancelled": 1}


def test_lag_is_reconstructed_minute_by_minute() -> None:
    # "slow": one job waited from 30 to 20 minutes ago, then ran.
    insert("completed", queue="slow", run_ago=1800, started_ago=1200, finished_ago=1190)
    # "stalled": a job due for 7 minutes that nobody claimed (and one not due yet).
    insert("pending", queue="stalled", run_ago=420, started_ago=None, finished_ago=None)
    insert("pending", queue="stalled", run_ago=-600, started_ago=None, finished_ago=None)
    # "busy": a job claimed 2 minutes ago after a 3-minute wait, still running.
    insert("running", queue="busy", run_ago=300, started_ago=120, finished_ago=None)
    # "quick": jobs that never waited are not a lag.
    insert("completed", queue="quick", run_ago=600, started_ago=600, finished_ago=599, n=4)
    ov, data = current(stale_after=3600)
    now = ov.now
    assert set(data.lag) == {"slow", "stalled", "busy"}, "jobs that never waited draw no line"

    def expected(t_index: int, run_ago: float, end_ago: float | None) -> float:
        t = now if t_index == 60 else data.minutes[t_index]
        run_at = now - timedelta(seconds=run_ago)
        end = now if end_ago is None else now - timedelta(seconds=end_ago)
        if run_at <= t and (t < end or (end_ago is None)):
            return (t - run_at).total_seconds()
        return 0.0

    for i in range(61):
        t = now if i == 60 else data.minutes[i]
        assert data.lag["slow"][i] == pytest.approx(expected(i, 1800, 1200)), t
        assert data.lag["stalled"][i] == pytest.approx(expected(i, 420, None)), t
        # A job still running was claimed before now: no lag at now.
        assert data.lag["busy"][i] == pytest.approx(expected(i, 300, 120) if i < 60 else 0), t
    assert data.lag["stalled"][-1] == pytest.approx(420)
    assert max(data.lag["slow"]) > 500


def test_overview_page_draws_both_charts(admin_client: Client) -> None:
    insert("completed", run_ago=200, started_ago=125, finished_ago=125, n=4)
    insert("dead", run_ago=400, started_ago=305, finished_ago=305)
    insert("pending", queue="emails<&>", run_ago=240, started_ago=None, finished_ago=None)
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="pgjobs-live"' in html and "overview-refresh.js" in html
    assert 'data-refresh-seconds="10"' in html
    finished = re.search(r'<svg id="pgjobs-chart-finished".*?</svg>', html, re.S)
    lag = re.search(r'<svg id="pgjobs-chart-lag".*?</svg>', html, re.S)
    assert finished and lag
    bars = re.findall(r'<rect [^>]*data-outcome="(\w+)"', finished.group(0))
    assert sorted(bars) == ["completed", "dead"]
    assert "5 jobs finished in the last 60 minutes; completed 4, dead 1" in finished.group(0)
    # Queue names are escaped everywhere they are drawn.
    assert 'data-queue="emails&lt;&amp;&gt;"' in lag.group(0)
    assert "<&>" not in lag.group(0)
    assert "emails&lt;&amp;&gt;: now 4 min" in lag.group(0)


def test_fragment_is_only_the_live_part(admin_client: Client) -> None:
    insert("completed", run_ago=60, started_ago=30, finished_ago=20)
    response = admin_client.get(OVERVIEW + "?fragment=live")
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in html and "pgjobs-reap" not in html
    for part in (
        'id="pgjobs-chart-finished"',
        'id="pgjobs-chart-lag"',
        'id="pgjobs-queues"',
        'id="card-60m"',
        'id="pgjobs-workers"',
    ):
        assert part in html, part
    assert 'data-refresh-seconds="2"' in admin_client.get(OVERVIEW + "?refresh=2").content.decode()
    assert charts.refresh_seconds("0") == 1
    assert charts.refresh_seconds("99999") == 300
    assert charts.refresh_seconds("soon") == charts.REFRESH_SECONDS


def test_fragment_needs_view_permission(client: Client, django_user_model: Any) -> None:
    django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.login(username="staff", password="pw")
    assert client.get(OVERVIEW + "?fragment=live").status_code == 403


def test_empty_charts_render() -> None:
    _, data = current()
    html = charts.finished_chart(data.minutes, data.finished)
    assert "0 jobs finished" in html and "<rect" not in html
    assert "no queue lagged" in charts.lag_chart(data.minutes, {})


def test_chart_queries_are_a_constant_two(admin_client: Client) -> None:
    def count() -> int:
        with CaptureQueriesContext(connection) as q:
            assert admin_client.get(OVERVIEW).status_code == 200
        return len(q.captured_queries)

    small = count()
    for i in range(30):
        insert("completed", queue=f"q{i}", run_ago=600 + i, started_ago=300, finished_ago=200)
    assert count() == small


def _plan(statement: str) -> str:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, {"window": 3600.0})
        value = cur.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


@pytest.mark.scale
def test_chart_queries_stay_on_the_indexes_at_a_million_rows() -> None:
    with connection.cursor() as cur:
        # A million finished jobs older than the window, a little recent activity.
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, status, run_at, created_at, started_at,"
            " finished_at, attempts, lease)"
            " SELECT 'history', 'q' || (g % 20), CASE WHEN g % 50 = 0 THEN 'dead'"
            " ELSE 'completed' END, t, t, t, t, 1, 1"
            " FROM (SELECT g, now() - interval '2 hours' - make_interval(secs => g) AS t"
            "       FROM generate_series(1, 1000000) g) s"
        )
        cur.execute(f"ANALYZE {JOB}")
    insert("completed", run_ago=300, started_ago=200, finished_ago=100, n=50)
    insert("running", run_ago=300, started_ago=200, finished_ago=None, n=5)
    for statement in (activity.FINISHED_PER_MINUTE, activity.CLAIMED_PER_MINUTE):
        plan = _plan(statement)
        # The jobs table through its indexes only (the rollup's tables are small).
        assert not re.search(r'"Node Type": "Seq Scan"[^{}]*"Relation Name": "' + JOB, plan), plan
        assert "pgjobs_job_finished_idx" in plan, plan
        if statement is activity.CLAIMED_PER_MINUTE:  # and the running jobs
            assert "pgjobs_job_running_idx" in plan or "pgjobs_job_status_idx" in plan, plan
    # And the page's answer is still exact.
    _, data = current()
    assert data.finished_total["completed"] == 50
