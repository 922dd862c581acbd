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

Metric names and labels are a public contract, stated by the reference page
``docs/reference/metrics.md``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
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
from django_pgjobs.health.queue_stats import QueueSample, QueueStatsRefresher, configured_queues

logger = logging.getLogger("django_pgjobs")

#: Values of the ``outcome`` label of ``pgjobs_jobs_finished_total``.
OUTCOMES = ("completed", "retried", "dead", "fenced", "released", "timed_out", "parked")
#: Values of the ``state`` label of ``pgjobs_queue_jobs``. ``due`` is the part of
#: ``pending`` whose run_at has passed, ``stuck`` the part of ``running`` whose
#: heartbeat is stale: sum only pending, running, blocked (workflow jobs waiting
#: for their parents, not claimable) and waiting (durable jobs parked in a sleep or
#: a wait, holding no worker).
QUEUE_STATES = ("pending", "due", "running", "stuck", "blocked", "waiting")
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
#: Where ``/metrics`` listens unless ``--metrics-address`` or ``METRICS_ADDRESS`` says
#: otherwise: this host only, so nothing is exposed to the network unless asked.
DEFAULT_ADDRESS = "127.0.0.1"
#: How many finished runs are remembered so a run reported twice (a timeout also
#: reported as a failure) is counted once.
REMEMBERED_RUNS = 10_000


#: The ``queue`` label of every queue that keeps no label of its own.
OTHER = "other"


class QueueCollector:
    """``pgjobs_queue_jobs``, ``pgjobs_queue_lag_seconds`` and
    ``pgjobs_queue_fair_wait_seconds`` from the last snapshot,
    and the ``queue`` label every metric of the process uses.

    A custom collector rather than labelled Gauges: a snapshot replaces the last
    one whole, so a queue that is gone leaves no series behind. Label cardinality is
    bounded: only the ``kept`` queues (configured, or with a row in the queue table,
    see ``QueueStatsRefresher``) have their own label, always reported (at zero when
    empty); every other queue is folded into ``queue="other"`` (counts summed, lag
    and fair wait the largest). ``kept=None`` (the default, for code that builds its own metrics)
    folds nothing.
    """

    def __init__(self, kept: Iterable[str] | None = None) -> None:
        self._samples: dict[str, QueueSample] = {}
        self._kept: frozenset[str] | None = None if kept is None else frozenset(kept)
        self._lock = threading.Lock()

    def label(self, queue: str | None) -> str:
        """The ``queue`` label of ``queue``: its name if it is kept, else ``other``."""
        kept = self._kept
        name = queue or ""
        return name if kept is None or name in kept else OTHER

    def update(
        self,
        samples: Sequence[QueueSample],
        *,
        known: Sequence[str] = (),
        kept: Iterable[str] | None = None,
    ) -> None:
        """Replace the snapshot; ``known`` queues (and ``kept`` ones, which become the
        labelled set) are reported at zero when empty; the rest fold into ``other``."""
        with self._lock:
            if kept is not None:
                self._kept = frozenset((*kept, *known))
            labelled = set(known) if self._kept is None else set(self._kept)
            fresh = {name: QueueSample(name) for name in labelled}
            if self._kept is not None:
                fresh[OTHER] = QueueSample(OTHER)
            for s in samples:
                name = s.queue if self._kept is None or s.queue in self._kept else OTHER
                into = fresh.setdefault(name, QueueSample(name))
                for state in QUEUE_STATES:
                    setattr(into, state, getattr(into, state) + getattr(s, state))
                into.lag = max(into.lag, s.lag)
                into.fair_wait = max(into.fair_wait, s.fair_wait)
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
            "Jobs per queue and state (pending, due, running, stuck, blocked, waiting), "
            "read from the partial indexes on an interval. due is part of pending, stuck "
            "part of running; blocked jobs wait for their parents (workflows), waiting "
            "jobs in a sleep or a wait (durable jobs).",
            labels=["queue", "state"],
        )
        lag = GaugeMetricFamily(
            "pgjobs_queue_lag_seconds",
            "Age of the oldest due pending job per queue (0 when nothing is due).",
            labels=["queue"],
        )
        fair = GaugeMetricFamily(
            "pgjobs_queue_fair_wait_seconds",
            "Fair shares: the longest a fair key with a due job and none running has "
            "waited for its turn, per queue (0 without fair keys).",
            labels=["queue"],
        )
        for s in samples:
            for state in QUEUE_STATES:
                jobs.add_metric([s.queue, state], getattr(s, state))
            lag.add_metric([s.queue], s.lag)
            fair.add_metric([s.queue], s.fair_wait)
        return [jobs, lag, fair]


class WorkerMetrics:
    """The metrics of one process, and the signal receivers that feed them.

    ``connect()`` subscribes to the job signals; ``serve(port)`` starts the HTTP
    endpoint. Each instance has its own registry, so tests can make several.
    """

    #: The queue refresher that ``start()`` runs alongside (None: not started).
    refresher: QueueStatsRefresher | None = None

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        process_metrics: bool = True,
        kept: Iterable[str] | None = None,
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
        self.queues = QueueCollector(kept)
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
            (signals.job_succeeded, functools.partial(self._on_outcome, "completed")),
            (signals.job_failed, functools.partial(self._on_outcome, "retried")),
            (signals.job_dead, functools.partial(self._on_outcome, "dead")),
            (signals.job_timed_out, functools.partial(self._on_outcome, "timed_out")),
            (signals.job_released, functools.partial(self._on_outcome, "released")),
            (signals.job_parked, functools.partial(self._on_outcome, "parked")),
            (signals.job_fenced, functools.partial(self._on_outcome, "fenced")),
        ]

    def connect(self) -> WorkerMetrics:
        for signal, receiver in self._receivers():
            signal.connect(receiver, weak=False, dispatch_uid=self._uid)
        return self

    def disconnect(self) -> None:
        for signal, _ in self._receivers():
            signal.disconnect(dispatch_uid=self._uid)

    def serve(self, port: int, addr: str = DEFAULT_ADDRESS) -> int:
        """Serve ``/metrics`` on ``addr``:``port`` (0: a free port) in a daemon thread;
        return the port."""
        self.server, _ = start_http_server(port, addr, registry=self.registry)
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
            self.claimed.labels(self.queues.label(queue)).inc(n)

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
        queue = self.queues.label(queue)
        self.finished.labels(task, queue, outcome).inc()
        if duration is None and started is not None:
            duration = time.monotonic() - started
        if observe and duration is not None:
            self.duration.labels(task, queue).observe(duration)

    def _on_outcome(
        self,
        outcome: str,
        *,
        job_id: int,
        lease: int,
        task: str,
        queue: str | None = None,
        **kw: Any,
    ) -> None:
        """One receiver for every outcome signal (``_receivers`` binds ``outcome``)."""
        if outcome == "fenced" and kw.get("write") == "heartbeat":
            return  # a notice while the job still runs; its final write is reported later
        if outcome in ("retried", "dead") and _is_timeout(kw.get("exception")):
            outcome = "timed_out"  # a timeout also reported as a failure: counted once, here
        # Given back unfinished at shutdown: counted, but not a run's duration.
        observe = outcome != "released"
        duration = kw.get("duration")
        self._finish(outcome, job_id, lease, task, queue, duration=duration, observe=observe)


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
    address: str = DEFAULT_ADDRESS,
    queues: Sequence[str] | None = None,
    alias: str | None = None,
    interval: float | None = None,
) -> tuple[WorkerMetrics, int]:
    """Connect the receivers, start the queue refresher, serve ``/metrics`` on
    ``address``:``port``.

    Returns the metrics and the port actually bound (``port=0`` picks a free one).
    Raises ``OSError`` when the address or port cannot be bound.
    """
    global _active
    stop()
    # Only configured queues keep a label until the refresher's first read of the
    # queue table (at once, before the first claim in practice).
    metrics = WorkerMetrics(kept=configured_queues(queues))
    # Made first: it reads PGJOBS_METRICS_INTERVAL, and a bad one must stop nothing half-started.
    refresher = QueueStatsRefresher(metrics.queues, queues=queues, alias=alias, interval=interval)
    bound = metrics.serve(port, address)
    metrics.connect()
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
