"""The overview's charts in a real headless Chromium, refreshing in place.

An hour of history is written with plain INSERTs (jobs finished minute by minute,
a queue that fell behind and caught up, one that is behind now); the page must
draw both charts, then pick up jobs a worker completes meanwhile without a
reload. The screenshot goes to ``docs/_static/screenshots/overview-charts.png``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection

from django_pgjobs.db.tables import JOB
from django_pgjobs.testing import run_jobs
from tests.helpers.browser import SCREENSHOTS
from tests.testapp.jobs import add

pytestmark = [pytest.mark.browser]


def _history() -> None:
    with connection.cursor() as cur:
        # Completed jobs in every minute of the hour, more in the middle; a few dead.
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, status, run_at, created_at, started_at,"
            " finished_at, attempts, lease)"
            " SELECT 'tests.testapp.jobs.add', q, CASE WHEN g % 23 = 0 THEN 'dead'"
            " ELSE 'completed' END, t - interval '2 seconds', t - interval '2 seconds',"
            " t - interval '1 second', t, 1, 1"
            " FROM (SELECT g, (ARRAY['default', 'emails', 'reports'])[1 + g % 3] AS q,"
            "              now() - make_interval(secs => (g * 37) % 3540 + 20) AS t"
            "         FROM generate_series(1, 900) g) s"
            " CROSS JOIN LATERAL generate_series(1, 1 + (abs(1800 - extract(epoch FROM"
            "     now() - t)::int) < 900)::int) AS extra"
        )
        # "emails" fell behind 40 minutes ago: jobs waited up to 9 minutes, then caught up.
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, status, run_at, created_at, started_at,"
            " finished_at, attempts, lease)"
            " SELECT 'tests.testapp.jobs.send_email', 'emails', 'completed', r, r, s, s, 1, 1"
            " FROM (SELECT now() - make_interval(mins => 40) + make_interval(secs => g * 30) AS r,"
            "              now() - make_interval(mins => 31) + make_interval(secs => g * 10) AS s"
            "         FROM generate_series(0, 18) g) x"
        )
        # "reports" is behind now: a job due 12 minutes ago that nobody claimed.
        cur.execute(
            f"INSERT INTO {JOB} (task, queue, run_at, args)"
            " VALUES ('tests.testapp.jobs.add', 'reports', now() - interval '12 minutes',"
            " '[1, 2]')"
        )
        cur.execute(f"ANALYZE {JOB}")


def test_overview_charts_refresh_in_place(
    page: Any,
    live_server: Any,
    django_user_model: Any,
) -> None:
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "3am-password")
    _history()
    base = live_server.url
    page.goto(f"{base}/admin/login/?next=/admin/django_pgjobs/job/overview/%3Frefresh%3D1")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "3am-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#pgjobs-chart-finished")
    if page.locator("#toggle-nav-sidebar").is_visible():
        page.click("#toggle-nav-sidebar")

    bars = page.locator("#pgjobs-chart-finished g.bar")
    assert bars.count() >= 55, "a bar for (nearly) every minute of the hour"
    assert page.locator("#pgjobs-chart-finished rect[data-outcome=dead]").count() > 0
    lines = page.locator("#pgjobs-chart-lag polyline.lag")
    queues = sorted(lines.nth(i).get_attribute("data-queue") for i in range(lines.count()))
    assert {"emails", "reports"} <= set(queues), queues
    assert page.locator("#pgjobs-chart-finished").bounding_box()["height"] > 100
    legend = page.inner_text("#pgjobs-lag-box .pgjobs-legend")
    # Due 12 minutes before the page was drawn: on a loaded machine the page comes a few
    # seconds later, and the age reads 12.1 min.
    assert re.search(r"reports now 12(\.\d)? min", legend), legend

    # Work done meanwhile shows up without a reload.
    page.evaluate("window.__pgjobsNoReload = 42")
    before = int(page.inner_text("#card-60m .n"))
    for i in range(5):
        add.enqueue(i, i)
    assert len(run_jobs(queues=["default"])) == 5
    page.wait_for_function(
        f"document.querySelector('#card-60m .n').textContent.trim() === '{before + 5}'",
        timeout=20_000,
    )
    assert page.evaluate("window.__pgjobsNoReload") == 42, "the page was not reloaded"
    assert page.get_attribute("#pgjobs-live", "data-refreshed-at")
    assert page.locator("#pgjobs-chart-finished g.bar").count() >= 55

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / "overview-charts.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 20_000
