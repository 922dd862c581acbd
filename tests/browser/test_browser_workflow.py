"""A workflow run's page in a real headless Chromium: the graph drawn, a node followed
to its job and back, its failed node retried from the page (its dependent resumes).
The screenshot goes to ``docs/_static/screenshots/workflow.png`` for the how-to.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_pgjobs import Workflow
from django_pgjobs.admin.workflow_graph import PER_LAYER
from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs
from tests import workflow_jobs as w
from tests.helpers.browser import SCREENSHOTS

pytestmark = [pytest.mark.browser]


def _import_feed() -> tuple[Any, Job, Job]:
    """fetch -> 3 parsers (one fails) -> store -> report, and 40 resizes after fetch."""
    wf = Workflow("import-feed")
    fetch = wf.add(w.double.si(1), name="fetch")
    parsers = [wf.add(w.double.si(i), after=[fetch], name=f"parse-{i}") for i in range(2)]
    bad = wf.add(w.explode.si("bad row 17"), after=[fetch], name="parse-2")
    store = wf.add(w.double.si(3), after=[*parsers, bad], name="store")
    wf.add(w.double.si(4), after=[store], name="report")
    for i in range(40):
        wf.add(w.double.si(i), after=[fetch], name=f"resize-{i}")
    run = wf.enqueue()
    run_jobs()
    by_name = {j.node: j for j in Job.objects.filter(workflow_id=run.id)}
    return run, by_name["parse-2"], by_name["store"]


def test_a_run_page_draws_the_graph_and_retries_a_failed_node(
    page: Any,
    live_server: Any,
    django_user_model: Any,
) -> None:
    run, bad, store = _import_feed()
    assert (bad.status, store.status) == ("dead", "cancelled")
    base = live_server.url
    user = {"username": "oncall", "password": "3am-password"}
    django_user_model.objects.create_superuser(email="oncall@example.com", **user)
    page.goto(f"{base}/admin/login/?next=/admin/django_pgjobs/workflow/")
    for field, value in user.items():
        page.fill(f"#id_{field}", value)
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list .pgjobs-progress")
    # finished: 43 completed, the bad parser dead, store and report cancelled
    assert "46 / 46 done" in page.inner_text("#result_list")

    page.click(f"#result_list >> text={run.name}")
    page.wait_for_selector("#pgjobs-graph")
    # fetch; 20 of the 43 parsers and resizes, the other 23 one box; store; report
    assert page.locator("#pgjobs-graph a.pgjobs-node").count() == 1 + PER_LAYER + 1 + 1
    more = page.locator("#pgjobs-graph a.pgjobs-more")
    assert more.get_attribute("data-nodes") == str(43 - PER_LAYER)
    dead = page.locator(f'#pgjobs-graph a.pgjobs-node[data-id="{bad.id}"]')
    assert dead.get_attribute("data-status") == "dead"
    box = page.locator("#pgjobs-graph").bounding_box()
    assert box["width"] > 500 and box["height"] > 200
    assert page.locator("#pgjobs-cancel-run").count() == 0, "nothing left to cancel"
    page.set_viewport_size({"width": 1280, "height": 1000})
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / "workflow.png"
    page.locator("#pgjobs-run-graph").screenshot(path=str(path))
    assert path.stat().st_size > 10_000

    # a node is a link to its job; the job's page links back to the run
    dead.click()
    page.wait_for_url(f"**/job/{bad.id}/change/")
    page.click(f"text=run #{run.id}")
    page.wait_for_selector("#pgjobs-graph")

    # make the failed parser succeed this time, then retry it from the page
    Job.objects.filter(id=bad.id).update(task=w.double.name, args=[2])
    page.click("#pgjobs-retry-failed")
    page.wait_for_selector("text=Retried 1 failed node(s).")
    assert Job.objects.get(id=store.id).status == "blocked", "resumed: waits for its parser"
    run_jobs()
    page.goto(f"{base}/admin/django_pgjobs/workflow/{run.id}/change/")
    statuses = page.locator("#pgjobs-graph a.pgjobs-node")
    assert {statuses.nth(i).get_attribute("data-status") for i in range(statuses.count())} == {
        "completed"
    }
    assert "46 / 46 done" in page.inner_text("#pgjobs-run-graph")
