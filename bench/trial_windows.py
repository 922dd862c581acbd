"""The held-horizon trial's record cut into windows, and the issue's criteria on them.

Pure functions over what ``trial_peer.py`` recorded: each offered job's enqueue
time ``ts``, the time its handler started, the phase boundaries and the jobs
tables' samples. A job belongs to the window its ``ts`` falls in; windows never
straddle a phase boundary (the last one of a phase may be shorter).
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

PHASES = ("before", "during", "after")


def pct(sorted_vals: list[float], q: float) -> float:
    """Linear-interpolated percentile, as the harness's ``benchlib._pct``."""
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


@dataclass
class Window:
    phase: str
    start: float  # seconds from the first offered job
    end: float
    offered: int = 0
    skipped: int = 0  # scheduled, but the enqueuer was over a second late: not sent
    started: int = 0
    p50_ms: float = float("nan")
    p95_ms: float = float("nan")
    max_ms: float = float("nan")
    enqueue_p95_ms: float = float("nan")  # the enqueue call itself (INSERT + commit)
    # start - the enqueue call's return (~ its commit): the queue's share of the latency,
    # without the commit's WAL flush, which a busy disk makes most of it
    after_commit_p95_ms: float = float("nan")
    lag_max_ms: float = 0.0  # how late the enqueuer offered against its schedule
    backlog_max: int = 0  # offered and not yet started, at its worst in the window
    dead_max: int = 0  # jobs tables' n_dead_tup, most seen in the window
    live_last: int = 0
    autovacuums: int = 0  # autovacuum passes on the jobs tables that ended in it
    lats: list[float] = field(default_factory=list, repr=False)


def read_sent(path: str) -> list[tuple[float, float, float]]:
    with open(path) as f:
        return [(float(a), float(b), float(c)) for a, b, c in (line.split() for line in f)]


def read_started(path: str) -> tuple[dict[float, float], int]:
    """ts -> first start, and how many handler runs were repeats of a job."""
    first: dict[float, float] = {}
    repeats = 0
    with open(path) as f:
        for line in f:
            ts_s, start_s = line.split()
            ts, start = float(ts_s), float(start_s)
            if ts < 0:  # warm-up
                continue
            if ts in first:
                repeats += 1
                first[ts] = min(first[ts], start)
            else:
                first[ts] = start
    return first, repeats


def cut(t0: float, bounds: list[float], window: float) -> list[Window]:
    """Windows of ``window`` s inside each phase [bounds[i], bounds[i + 1])."""
    out: list[Window] = []
    for phase, (a, b) in zip(PHASES, itertools.pairwise(bounds), strict=True):
        t = a
        while t < b - 1e-9:
            out.append(Window(phase, round(t - t0, 3), round(min(t + window, b) - t0, 3)))
            t += window
    return out


def fill(
    windows: list[Window],
    t0: float,
    sent: list[tuple[float, float, float]],
    started: dict[float, float],
    samples: list[list[float]],
) -> None:
    """Latency, enqueue cost, backlog and table counts of each window."""

    starts = [w.start for w in windows]

    def index(t: float) -> int | None:
        i = bisect.bisect_right(starts, t - t0) - 1
        return i if i >= 0 and t - t0 < windows[i].end else None

    calls: list[list[float]] = [[] for _ in windows]
    after_commit: list[list[float]] = [[] for _ in windows]
    for due, ts, call_ms in sent:
        t = due if math.isnan(ts) else ts
        i = index(t)
        if i is None:
            i = len(windows) - 1 if t - t0 >= windows[-1].end else 0
        w = windows[i]
        if math.isnan(ts):
            w.skipped += 1
            continue
        w.offered += 1
        w.lag_max_ms = max(w.lag_max_ms, (ts - due) * 1000)
        calls[i].append(call_ms)
        if ts in started:
            w.started += 1
            w.lats.append((started[ts] - ts) * 1000)
            after_commit[i].append(w.lats[-1] - call_ms)
    for w, c, a in zip(windows, calls, after_commit, strict=True):
        w.lats.sort()
        if w.lats:
            w.p50_ms, w.p95_ms, w.max_ms = pct(w.lats, 0.5), pct(w.lats, 0.95), w.lats[-1]
        if c:
            w.enqueue_p95_ms = pct(sorted(c), 0.95)
        if a:
            w.after_commit_p95_ms = pct(sorted(a), 0.95)
    # Backlog: +1 at each enqueue, -1 at each first start, swept in time order.
    events = sorted(
        [(ts, 1) for _, ts, _ in sent if not math.isnan(ts)] + [(s, -1) for s in started.values()]
    )
    level, k = 0, 0
    for w in windows:
        w.backlog_max = level
        while k < len(events) and events[k][0] - t0 < w.end:
            level += events[k][1]
            if events[k][0] - t0 >= w.start:
                w.backlog_max = max(w.backlog_max, level)
            k += 1
    prev_vacuums = None
    for t, dead, live, vacuums in samples:
        i = index(t)
        if prev_vacuums is not None and i is not None:
            windows[i].autovacuums += int(vacuums - prev_vacuums)
        prev_vacuums = vacuums
        if i is not None:
            windows[i].dead_max = max(windows[i].dead_max, int(dead))
            windows[i].live_last = int(live)


def verdict(windows: list[Window], rate: float, release_at: float) -> dict[str, Any]:
    """The issue's done-criteria, computed (``release_at``: seconds from t0)."""
    base_p95s = [w.p95_ms for w in windows if w.phase == "before" and w.lats]
    base = statistics.median(base_p95s) if base_p95s else float("nan")
    limit = min(3 * base, 50.0)
    measured = [w for w in windows if w.lats]
    worst = max(measured, key=lambda w: w.p95_ms) if measured else None
    backlog = max(windows, key=lambda w: w.backlog_max)
    after = [w for w in windows if w.phase == "after"]
    recovered_at = None
    for i in range(len(after)):
        if all(w.lats and w.p95_ms <= 1.2 * base for w in after[i:]):
            recovered_at = after[i].start - release_at
            break
    # The same criterion measured from the enqueue's commit: the queue's own share, apart
    # from the producer's INSERT and commit (a stalled fsync fails the criterion
    # on the producer's side; this says whether the claim kept up). Informational.
    base_c = [w.after_commit_p95_ms for w in windows if w.phase == "before" and w.lats]
    base_cm = statistics.median(base_c) if base_c else float("nan")
    limit_c = min(3 * base_cm, 50.0)
    worst_c = max((w.after_commit_p95_ms for w in measured), default=float("nan"))
    lag = max(w.lag_max_ms for w in windows)
    offered = sum(w.offered for w in windows)
    skipped = sum(w.skipped for w in windows)
    started = sum(w.started for w in windows)
    return {
        "baseline_p95_ms": base,
        "baseline_spread": (max(base_p95s) / base) if base_p95s and base else float("nan"),
        "p95_limit_ms": limit,
        "worst_p95_ms": worst.p95_ms if worst else float("nan"),
        "worst_window": f"{worst.phase} {worst.start:g}-{worst.end:g} s" if worst else "-",
        "p95_ok": bool(worst) and all(w.p95_ms <= limit for w in measured),
        "from_commit_baseline_p95_ms": base_cm,
        "from_commit_worst_p95_ms": worst_c,
        "from_commit_limit_ms": limit_c,
        "from_commit_ok": bool(measured)
        and all(w.after_commit_p95_ms <= limit_c for w in measured),
        "backlog_max": backlog.backlog_max,
        "backlog_window": f"{backlog.phase} {backlog.start:g}-{backlog.end:g} s",
        "backlog_ok": backlog.backlog_max <= rate,
        "recovered_after_s": recovered_at,
        "recovery_ok": recovered_at is not None and recovered_at <= 60.0,
        "offer_lag_max_ms": lag,
        "skipped": skipped,
        "offer_on_time": skipped <= 0.01 * (offered + skipped),
        "offered": offered,
        "started": started,
        "all_started": offered == started,
    }


def as_rows(windows: list[Window]) -> list[dict[str, Any]]:
    rows = []
    for w in windows:
        d = asdict(w)
        del d["lats"]
        rows.append(d)
    return rows
