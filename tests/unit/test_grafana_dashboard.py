"""The Grafana dashboard in docs/ uses exactly the metrics (and labels) a worker exposes."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_pgjobs.health.metrics import WorkerMetrics
from django_pgjobs.health.queue_stats import QueueSample
from tests.conftest import ROOT

DASHBOARD = ROOT / "docs" / "_static" / "grafana" / "django-pgjobs-dashboard.json"
SPEC_NAMES = {
    "pgjobs_jobs_finished_total",
    "pgjobs_jobs_claimed_total",
    "pgjobs_job_duration_seconds_bucket",
    "pgjobs_queue_jobs",
    "pgjobs_queue_lag_seconds",
    "pgjobs_worker_inflight",
}
PROMETHEUS_LABELS = {"le", "instance", "job"}


def exposed() -> dict[str, set[str]]:
    """Sample name -> label names, from a real registry with one of everything."""
    m = WorkerMetrics(process_metrics=False)
    m.finished.labels("t", "q", "completed").inc()
    m.claimed.labels("q").inc()
    m.duration.labels("t", "q").observe(0.1)
    m.queues.update([QueueSample("q", 1, 1, 0, 0, 2.0)])
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in exprs(v)]
    return []


def test_dashboard_uses_exactly_the_exposed_names_and_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = exprs(dashboard["panels"])
    assert len(queries) >= 10
    names = exposed()
    used: set[str] = set()
    for expr in queries:
        for name in re.findall(r"\bpgjobs_\w+", expr):
            assert name in names, f"{name} (in {expr!r}) is not a metric the worker exposes"
            used.add(name)
        labels = set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            labels |= {g.strip() for g in group.split(",")}
        metric_labels = set().union(*(names[n] for n in re.findall(r"\bpgjobs_\w+", expr)))
        assert labels <= metric_labels | PROMETHEUS_LABELS, (expr, labels - metric_labels)
    assert used >= SPEC_NAMES, f"panels miss {SPEC_NAMES - used}"
    queue_var = next(v for v in dashboard["templating"]["list"] if v["name"] == "queue")
    assert queue_var["definition"] == "label_values(pgjobs_queue_jobs, queue)"
