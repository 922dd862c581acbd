"""End to end in a real headless Chromium: find a dead job, retry it, watch a worker finish it.

Drives Debian's ``/usr/bin/chromium`` with Playwright's Python client against
pytest-django's live server, and a real ``runjobs --burst`` subprocess does the
work. Screenshots of the list, the detail page and the overview are saved to
``docs/_static/screenshots/`` for the how-to.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_pgjobs import claim
from django_pgjobs.models import Job, Worker
from django_pgjobs.testing import run_jobs
from tests.conftest import wait_until
from tests.helpers.admin_rows import wait_stuck
from tests.helpers.browser import SCREENSHOTS
from tests.testapp.jobs import add, always_fails, flaky_until, send_email

pytestmark = [pytest.mark.browser, pytest.mark.process]


def _seed(tmp_path: Path) -> tuple[Job, Job]:
    """A little history to look at: completed jobs, a stuck one, two dead ones, one scheduled."""
    add.enqueue_many([(i, i) for i in range(6)])
    send_email.enqueue_many([(f"user{i}@example.com",) for i in range(3)])
    run_jobs()
    flaky = flaky_until.using(max_attempts=1).enqueue(str(tmp_path / "runs"), 2)
    hopeless = always_fails.using(queue="billing", max_attempts=1).enqueue("card declined")
    run_jobs()
    add.using(queue="reports").enqueue(40, 2)
    [claimed] = claim.claim(connection, worker="web-1:4242:9f3c2a1b", queues=["reports"], n=1)
    wait_stuck(Job.objects.get(id=claimed.id))  # its "worker" never heartbeats: stuck
    send_email.using(delay=3600).enqueue("later@example.com", subject="reminder")
    add.using(queue="emails").enqueue(1, 1)  # due, not yet run
    return Job.objects.get(id=flaky.id), Job.objects.get(id=hopeless.id)


def _status_in_list(page: Any, base: str, job_id: int) -> str:
    page.goto(f"{base}/admin/django_pgjobs/job/?q={job_id}")
    return str(page.locator("#result_list .pgjobs-status").first.inner_text()).strip()


def test_retry_a_dead_job_from_the_browser(
    page: Any,
    live_server: Any,
    django_user_model: Any,
    tmp_path: Path,
    start_worker: Callable[..., Any],
) -> None:
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "3am-password")
    flaky, hopeless = _seed(tmp_path)
    base = live_server.url
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    page.goto(f"{base}/admin/login/?next=/admin/django_pgjobs/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "3am-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#pgjobs-overview-link")

    page.goto(f"{base}/admin/django_pgjobs/job/")
    page.wait_for_selector("#result_list")
    if page.locator("#toggle-nav-sidebar").is_visible():
        page.click("#toggle-nav-sidebar")  # more room for the columns (remembered per browser)
    assert page.locator(".pgjobs-stuck").count() == 1
    page.screenshot(path=str(SCREENSHOTS / "changelist.png"), full_page=True)

    page.click("#changelist-filter >> text=Dead-lettered")
    page.wait_for_url("**attention=dead**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    assert "card declined" in page.inner_text("#result_list")
    page.screenshot(path=str(SCREENSHOTS / "changelist-dead.png"), full_page=True)

    page.check(f"input[name=_selected_action][value='{flaky.id}']")
    page.select_option("select[name=action]", "retry_now")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert "Retried 1 job." in page.inner_text(".messagelist")
    assert rows.count() == 1, "the retried job left the dead-lettered list"
    assert _status_in_list(page, base, flaky.id) == "pending"

    burst = start_worker("--burst", "--concurrency", "2")
    assert burst.wait(timeout=60) == 0, burst.output()
    assert _status_in_list(page, base, flaky.id) == "completed"
    assert _status_in_list(page, base, hopeless.id) == "dead"

    page.goto(f"{base}/admin/django_pgjobs/job/{flaky.id}/change/")
    body = page.inner_text("#content-main")
    assert "RuntimeError: run 1 fails" in body and "Traceback" in body
    page.screenshot(path=str(SCREENSHOTS / "detail.png"), full_page=True)

    live = start_worker("--queues", "reports,emails", "--concurrency", "4")
    wait_until(lambda: Worker.objects.exists(), message="the worker to register")
    page.goto(f"{base}/admin/django_pgjobs/")
    page.click("text=Queue overview")
    page.wait_for_selector("#pgjobs-queues")
    assert page.inner_text("#card-workers .n") == "1"
    assert page.inner_text("#card-dead .n") == "1", "the retried job no longer counts as dead"
    page.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)
    for name in ("changelist.png", "changelist-dead.png", "detail.png", "overview.png"):
        assert (SCREENSHOTS / name).stat().st_size > 10_000, name
    live.signal(signal.SIGTERM)
    assert live.wait(timeout=30) == 0, live.output()
