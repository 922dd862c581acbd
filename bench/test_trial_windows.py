"""The held-horizon trial's windows and criteria, on made-up records.

Not in the suite's ``testpaths``: CI's static leg runs it; by hand,
``scripts/dev test bench/test_trial_windows.py``.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trial_windows import cut, fill, verdict

T0 = 1_000.0


def record(
    latency_ms: dict[str, float],
    rate: float = 100.0,
    secs: float = 60.0,
    call_ms: dict[str, float] | None = None,
):
    """Jobs at ``rate``/s for ``secs``; latency (and the enqueue call's own time, 1 ms
    unless given) per phase (before/during/after 20 s each)."""
    sent, started = [], {}
    for i in range(int(rate * secs)):
        ts = T0 + i / rate
        phase = "before" if ts - T0 < 20 else "during" if ts - T0 < 40 else "after"
        sent.append((ts, ts, (call_ms or {}).get(phase, 1.0)))
        started[ts] = ts + latency_ms[phase] / 1000
    return sent, started


def windows_of(latency_ms: dict[str, float], samples=None, call_ms=None):
    ws = cut(T0, [T0, T0 + 20, T0 + 40, T0 + 60], 10)
    sent, started = record(latency_ms, call_ms=call_ms)
    fill(ws, T0, sent, started, samples or [])
    return ws


def test_windows_follow_the_phases_and_the_last_one_is_short():
    ws = cut(T0, [T0, T0 + 25, T0 + 30, T0 + 45], 10)
    assert [(w.phase, w.start, w.end) for w in ws] == [
        ("before", 0, 10),
        ("before", 10, 20),
        ("before", 20, 25),
        ("during", 25, 30),
        ("after", 30, 40),
        ("after", 40, 45),
    ]


def test_latency_backlog_and_tables_per_window():
    samples = [[T0 + s, s * 10, 5, s // 15] for s in range(60)]
    ws = windows_of({"before": 5, "during": 50, "after": 5}, samples)
    assert [w.offered for w in ws] == [1000] * 6
    assert [w.started for w in ws] == [1000] * 6
    assert round(ws[0].p95_ms, 1) == 5.0 and round(ws[2].p95_ms, 1) == 50.0
    # 50 ms at 100/s: five jobs waiting at worst; the first after-window inherits them
    assert ws[2].backlog_max == 5 and ws[4].backlog_max == 5 and ws[5].backlog_max == 1
    assert ws[5].dead_max == 590 and ws[5].live_last == 5
    assert [w.autovacuums for w in ws] == [0, 1, 0, 1, 1, 0]


def test_a_job_that_never_started_is_counted_and_fails_the_record():
    ws = cut(T0, [T0, T0 + 20, T0 + 40, T0 + 60], 10)
    sent, started = record({"before": 5, "during": 5, "after": 5})
    del started[sent[2500][1]]
    fill(ws, T0, sent, started, [])
    v = verdict(ws, 100, 40)
    assert ws[2].offered - ws[2].started == 1
    assert (v["offered"], v["started"], v["all_started"]) == (6000, 5999, False)


def test_the_issue_criteria():
    v = verdict(windows_of({"before": 5, "during": 14, "after": 5}), 100, 40)
    assert v["p95_ok"] and v["backlog_ok"] and v["recovery_ok"] and v["offer_on_time"]
    assert round(v["p95_limit_ms"], 1) == 15.0 and v["recovered_after_s"] == 0
    v = verdict(windows_of({"before": 5, "during": 16, "after": 5}), 100, 40)
    assert not v["p95_ok"] and v["worst_window"] == "during 20-30 s"
    # slower than 1.2x of the baseline after the release: never recovered
    v = verdict(windows_of({"before": 5, "during": 5, "after": 6.5}), 100, 40)
    assert v["recovered_after_s"] is None and not v["recovery_ok"]
    # a backlog above one second of arrivals: 1.5 s latency at 100/s
    v = verdict(windows_of({"before": 5, "during": 1500, "after": 5}), 100, 40)
    assert v["backlog_max"] > 100 and not v["backlog_ok"]


def test_a_stalled_enqueue_commit_fails_the_criterion_but_not_the_queues_share():
    """The producer's INSERT and commit took 15 ms during the hold; the start came 2 ms
    after it, as before: the issue's criterion fails, the share from the commit holds."""
    latency = {"before": 3, "during": 17, "after": 3}
    v = verdict(windows_of(latency, call_ms={"during": 15.0}), 100, 40)
    assert not v["p95_ok"] and v["from_commit_ok"]
    assert round(v["from_commit_limit_ms"], 1) == 6.0
    assert round(v["from_commit_worst_p95_ms"], 1) == 2.0
    # a slow claim is slow from the commit too
    v = verdict(windows_of({"before": 3, "during": 17, "after": 3}), 100, 40)
    assert not v["p95_ok"] and not v["from_commit_ok"]


def test_recovery_is_the_start_of_the_tail_that_stays_within_1_2x():
    ws = windows_of({"before": 5, "during": 5, "after": 5})
    ws[4].p95_ms = 9.0  # first after-window slow, the next back
    assert verdict(ws, 100, 40)["recovered_after_s"] == 10
    ws[4].p95_ms, ws[5].p95_ms = 5.0, 9.0  # the last one slow again: not recovered
    assert verdict(ws, 100, 40)["recovered_after_s"] is None


def test_an_offer_that_fell_behind_is_flagged():
    ws = cut(T0, [T0, T0 + 20, T0 + 40, T0 + 60], 10)
    sent, started = record({"before": 5, "during": 5, "after": 5})
    for k in range(3000, 3100):  # 100 jobs skipped for being late: over 1 %
        due, ts, _ = sent[k]
        del started[ts]
        sent[k] = (due, math.nan, math.nan)
    due, ts, ms = sent[100]
    sent[100] = (due - 0.5, ts, ms)  # sent half a second after its due time
    fill(ws, T0, sent, started, [])
    v = verdict(ws, 100, 40)
    assert ws[3].skipped == 100 and ws[3].offered == 900 and ws[3].started == 900
    assert v["offer_lag_max_ms"] >= 500 and v["skipped"] == 100 and v["all_started"]
    assert not v["offer_on_time"]
