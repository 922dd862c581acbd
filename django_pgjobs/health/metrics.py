"""Prometheus metrics of one worker process (``runjobs --metrics-port``).

The counters and the histogram are fed by the package's signals
(``django_pgjobs.signals``), so the worker loop knows nothing about metrics and a
receiver of your own sees exactly what is counted. The queue gauges are read
from the same index-backed queries as ``jobs_status`` by a background thread on
an interval (``queue_stats.QueueStatsRefresher``), never per scrape, so a
scrape costs no database work however often Prometheus (or several of them)
asks.

Needs ``prometheus_client`` (``pip install "django-pgjobs[metrics]"``); importing
this module without it raises ``ImproperlyConfigured`` naming the extra.

Metric names and labels are the contract of SPEC §13 and the reference page
``docs/reference/metrics.md``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.exposition import start_http_server
    from prometheus_client.process_collector import ProcessCollector
except ImportError as exc:  # pragma: no cover - exercised by the install docs, not the suite
    raise ImproperlyConfigured(
        'Prometheus metrics need prometheus_client: pip install "django-pgjobs[metrics]"'
    ) from exc

from django_pgjobs import signals
from django_pgjobs.health.queue_stats import QueueSample, QueueStatsRefresher

logger = logging.getLogger("django_pgjobs")

#: Values of the ``outcome`` label of ``pgjobs_jobs_finished_total``.
OUTCOMES = ("completed", "retried", "dead", "fenced", "released", "timed_out")
#: Values of the ``state`` label of ``pgjobs_queue_jobs``. ``due`` is the part of
#: ``pending`` whose run_at has passed, ``stuck`` the part of ``running`` whose
#: heartbeat is stale: sum only pending and running.
QUEUE_STATES = ("pending", "due", "running", "stuck")
#: Histogram buckets (seconds): from no-op jobs to hour-long reports.
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
#: How many finished runs are remembered so a run reported twice (a timeout also
#: reported as a failure) is counted once.
REMEMBERED_RUNS = 10_000


class QueueCollector:
    """``pgjobs_queue_jobs`` and ``pgjobs_queue_lag_seconds`` from the last snapshot.

    A custom collector rather than labelled Gauges: a snapshot replaces the last
    one whole, and a queue that emptied reports zeros instead of lingering values.
    """

    def __init__(self) -> None:
        self._samples: dict[str, QueueSample] = {}
        self._lock = threading.Lock()

    def update(self, samples: Sequence[QueueSample], *, known: Sequence[str] = ()) -> None:
        """Replace the snapshot; queues seen before (or ``known``) stay, at zero."""
        with self._lock:
            fresh = {name: QueueSample(name) for name in (*self._samples, *known)}
            fresh.update((s.queue, s) for s in samples)
            self._samples = fresh

    def samples(self) -> list[QueueSample]:
        with self._lock:
            return sorted(self._samples.values(), key=lambda s: s.queue)

    def describe(self) -> Iterator[Metric]:
        return iter(self._families([]))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self.samples()))

    @staticmethod
    def _families(samples: list[QueueSample]) -> list[Metric]:
        jobs = GaugeMetricFamily(
            "pgjobs_queue_jobs",
            "Jobs per queue and state (pending, due, running, stuck), read from the "
            "partial indexes on an interval. due is part of pending, stuck part of running.",
            labels=["queue", "state"],
        )
        lag = GaugeMetricFamily(
            "pgjobs_queue_lag_seconds",
            "Age of the oldest due pending job per queue (0 when nothing is due).",
            labels=["queue"],
        )
        for s in samples:
            for state in QUEUE_STATES:
                jobs.add_metric([s.queue, state], getattr(s, state))
            lag.add_metric([s.queue], s.lag)
        return [jobs, lag]


class WorkerMetrics:
    """The metrics of one process, and the signal receivers that feed them.

    ``connect()`` subscribes to the job signals; ``serve(port)`` starts the HTTP
    endpoint. Each instance has its own registry, so tests can make several.
    """

    #: The queue refresher that ``start()`` runs alongside (None: not started).
    refresher: QueueStatsRefresher | None = None

    def __init__(
        self, registry: CollectorRegistry | None = None, *, process_metrics: bool = True
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.finished = Counter(
            "pgjobs_jobs_finished",
            "Runs of jobs that ended, by task, queue and outcome "
            "(completed, retried, dead, fenced, released, timed_out).",
            ["task", "queue", "outcome"],
            registry=self.registry,
        )
        self.claimed = Counter(
            "pgjobs_jobs_claimed",
            "Jobs claimed by this worker, by queue.",
            ["queue"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "pgjobs_job_duration_seconds",
            "Seconds from a job's start to its outcome, by task and queue.",
            ["task", "queue"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.inflight = Gauge(
            "pgjobs_worker_inflight",
            "Jobs this worker has claimed and not yet finished.",
            registry=self.registry,
        )
        self.inflight.set_function(self._inflight_count)
        self.queues = QueueCollector()
        self.registry.register(self.queues)
        if process_metrics:
            ProcessCollector(registry=self.registry)
        self._lock = threading.Lock()
        self._inflight: set[int] = set()
        self._started: dict[tuple[int, int], float] = {}
        self._counted: OrderedDict[tuple[int, int], str] = OrderedDict()
        self._uid = f"pgjobs-metrics-{id(self)}"
        self.server: Any = None

    # ------------------------------------------------------------------ wiring

    def _receivers(self) -> list[tuple[Any, Any]]:
        return [
            (signals.jobs_claimed, self._on_claimed),
            (signals.job_started, self._on_started),
            (signals.job_succeeded, self._on_succeeded),
            (signals.job_failed, self._on_failed),
            (signals.job_dead, self._on_dead),
            (signals.job_timed_out, self._on_timed_out),
            (signals.job_released, self._on_released),
            (signals.job_fenced, self._on_fenced),
        ]

    def connect(self) -> WorkerMetrics:
        for signal, receiver in self._receivers():
            signal.connect(receiver, weak=False, dispatch_uid=self._uid)
        return self

    def disconnect(self) -> None:
        for signal, _ in self._receivers():
            signal.disconnect(dispatch_uid=self._uid)

    def serve(self, port: int, addr: str = "") -> int:
        """Serve ``/metrics`` on ``port`` (0: a free one) in a daemon thread; return the port."""
        # All interfaces by default (documented): the scraper runs on another host.
        self.server, _ = start_http_server(
            port,
            addr or "0.0.0.0",  # noqa: S104
            registry=self.registry,
        )
        return int(self.server.server_port)

    def close(self) -> None:
        self.disconnect()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # ------------------------------------------------------------------ receivers

    def _inflight_count(self) -> int:
        with self._lock:
            return len(self._inflight)

    def _on_claimed(self, *, jobs: Sequence[tuple[int, str, str]], **_: Any) -> None:
        per_queue: dict[str, int] = {}
        for job_id, _task, queue in jobs:
            per_queue[queue] = per_queue.get(queue, 0) + 1
            with self._lock:
                self._inflight.add(job_id)
        for queue, n in per_queue.items():
            self.claimed.labels(queue).inc(n)

    def _on_started(self, *, job_id: int, lease: int, **_: Any) -> None:
        with self._lock:
            self._inflight.add(job_id)  # testing.run_jobs sends no jobs_claimed
            self._started[(job_id, lease)] = time.monotonic()

    def _finish(
        self,
        outcome: str,
        job_id: int,
        lease: int,
        task: str,
        queue: str | None,
        *,
        duration: float | None = None,
        observe: bool = True,
    ) -> None:
        key = (job_id, lease)
        with self._lock:
            if key in self._counted:
                return  # the same run reported twice (e.g. a timeout, then its failure)
            self._counted[key] = outcome
            if len(self._counted) > REMEMBERED_RUNS:
                self._counted.popitem(last=False)
            started = self._started.pop(key, None)
            self._inflight.discard(job_id)
        queue = queue or ""
        self.finished.labels(task, queue, outcome).inc()
        if duration is None and started is not None:
            duration = time.monotonic() - started
        if observe and duration is not None:
            self.duration.labels(task, queue).observe(duration)

    def _on_succeeded(
        self, *, job_id: int, lease: int, task: str, queue: str | None = None, **kw: Any
    ) -> None:
        self._finish("completed", job_id, lease, task, queue, duration=kw.get("duration"))

    def _on_failed(
        self, *, job_id: int, lease: int, task: str, queue: str | None = None, **kw: Any
    ) -> None:
        outcome = "timed_out" if _is_timeout(kw.get("exception")) else "retried"
        self._finish(outcome, job_id, lease, task, queue, duration=kw.get("duration"))

    def _on_dead(
        self, *, job_id: int, lease: int, task: str, queue: str | None = None, **kw: Any
    ) -> None:
        outcome = "timed_out" if _is_timeout(kw.get("exception")) else "dead"
        self._finish(outcome, job_id, lease, task, queue, duration=kw.get("duration"))

    def _on_timed_out(
        self, *, job_id: int, lease: int, task: str, queue: str | None = None, **kw: Any
    ) -> None:
        self._finish("timed_out", job_id, lease, task, queue, duration=kw.get("duration"))

    def _on_released(
        self, *, job_id: int, lease: int, task: str, queue: str | None = None, **_: Any
    ) -> None:
        # Given back unfinished at shutdown: counted, but not a run's duration.
        self._finish("released", job_id, lease, task, queue, observe=False)

    def _on_fenced(
        self,
        *,
        job_id: int,
        lease: int,
        task: str,
        queue: str | None = None,
        write: str = "",
        **kw: Any,
    ) -> None:
        if write == "heartbeat":
            return  # a notice while the job still runs; its final write is reported later
        self._finish("fenced", job_id, lease, task, queue, duration=kw.get("duration"))


def _is_timeout(exception: BaseException | None) -> bool:
    """A failure caused by ``@job(timeout=...)`` (``django_pgjobs.JobTimeout``)."""
    return exception is not None and type(exception).__name__ == "JobTimeout"


# ---------------------------------------------------------------------------
# One process's metrics, started by runjobs
# ---------------------------------------------------------------------------

_active: WorkerMetrics | None = None


def start(
    port: int,
    *,
    queues: Sequence[str] | None = None,
    alias: str | None = None,
    interval: float | None = None,
) -> tuple[WorkerMetrics, int]:
    """Connect the receivers, start the queue refresher, serve ``/metrics`` on ``port``.

    Returns the metrics and the port actually bound (``port=0`` picks a free one).
    Raises ``OSError`` when the port cannot be bound.
    """
    global _active
    stop()
    metrics = WorkerMetrics()
    bound = metrics.serve(port)
    metrics.connect()
    refresher = QueueStatsRefresher(metrics.queues, queues=queues, alias=alias, interval=interval)
    refresher.start()
    metrics.refresher = refresher
    _active = metrics
    return metrics, bound


def stop() -> None:
    """Stop what ``start`` started (the endpoint, the refresher, the receivers)."""
    global _active
    if _active is None:
        return
    refresher = getattr(_active, "refresher", None)
    if refresher is not None:
        refresher.stop()
    _active.close()
    _active = None
