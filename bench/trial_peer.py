"""One peer through the held-horizon trial: run by ``trial.py`` in that peer's venv.

Measures only; ``trial.py`` cuts the record into windows and judges it. The peer's
adapter from the shared harness (``peers/peer_<name>.py``) installs its schema,
starts its 2 worker processes and enqueues through its public single-job API; the
jobs are the harness's no-ops, and ``benchlib.handler_body(ts)`` in the worker
appends ``ts start`` for each one (``--started``).

Timeline: warm-up jobs until the workers run them; then jobs offered at ``--rate``
on a fixed schedule (one ``enqueue_one(ts)`` in autocommit each, ``ts`` taken just
before the call; the schedule dealt round-robin to ``--enqueuers`` threads, each
with its own adapter and connection; a job more than 1 s late is skipped, not sent
in a burst) for ``--baseline`` s; then a separate connection runs ``BEGIN;
SELECT txid_current()`` and stays idle in that transaction for ``--hold`` s, which
holds back the horizon of VACUUM in that database; then it commits and the offer
goes on for ``--after`` s. A sampler reads the jobs tables' row counts from
``pg_stat_user_tables`` every second. Prints one JSON line: phases, samples, counts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import threading
import time
from typing import Any

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--peer", required=True, help="harness peer name: peers/peer_<name>.py")
ap.add_argument("--db", required=True)
ap.add_argument("--rate", type=float, required=True, help="single enqueues offered per second")
ap.add_argument("--baseline", type=float, required=True, help="seconds before the hold")
ap.add_argument("--hold", type=float, required=True, help="seconds the horizon is held")
ap.add_argument("--after", type=float, required=True, help="seconds after the release")
ap.add_argument("--tables", required=True, help="LIKE pattern(s) of the jobs tables, comma list")
ap.add_argument(
    "--sent", required=True, help="file for 'scheduled ts call_ms' per job (nan nan: skipped)"
)
ap.add_argument("--started", required=True, help="the workers' 'ts start' file")
ap.add_argument("--enqueuers", type=int, default=4, help="connections enqueueing at once")
ap.add_argument("--drain-timeout", type=float, default=30.0)
A = ap.parse_args()

WORK = os.getcwd()
sys.path[:0] = [os.path.join(WORK, "peers"), WORK]
import benchlib  # noqa: E402
import psycopg  # noqa: E402
from benchutil import exit_on_sigterm  # noqa: E402  (bench/, this script's folder)

# An enqueuer this late skips the job rather than catch up in a burst: the windows keep
# their time, and the report counts what was skipped.
SKIP_LATE = 1.0
STATS = (
    "SELECT extract(epoch FROM clock_timestamp())::float8, coalesce(sum(n_dead_tup), 0)::bigint,"
    " coalesce(sum(n_live_tup), 0)::bigint, coalesce(sum(autovacuum_count), 0)::bigint"
    " FROM pg_stat_user_tables WHERE relname LIKE ANY(%s)"
)


class Sampler(threading.Thread):
    """The jobs tables' dead/live tuples and autovacuum count, once a second."""

    def __init__(self, dsn: str, patterns: list[str], limit_s: float):
        super().__init__(daemon=True)
        self.dsn, self.patterns, self.limit_s = dsn, patterns, limit_s
        self.samples: list[list[float]] = []
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        t_end = time.time() + self.limit_s
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set() and time.time() < t_end:
                    row = conn.execute(STATS, [self.patterns]).fetchone()
                    self.samples.append([float(v) for v in row])
                    self.stop.wait(1.0)
        except psycopg.Error as exc:  # reported in the JSON, judged by trial.py
            self.error = repr(exc)


def started_count(path: str) -> int:
    """Offered jobs whose handler ran (warm-up jobs carry ts -1 and are left out)."""
    try:
        with open(path) as f:
            return sum(1 for line in f if line.strip() and not line.startswith("-"))
    except FileNotFoundError:
        return 0


def warm_up(adapter: Any, procs: list[Any]) -> None:
    """Until both workers have run jobs, so start-up is not in the baseline."""
    with psycopg.connect(adapter.dsn, autocommit=True) as conn:
        cur = conn.cursor()
        deadline = time.time() + 120
        for _ in range(5):
            adapter.enqueue_one(-1.0)
        while adapter.count_done(cur) < 5:
            benchlib.check_alive(procs)
            if time.time() > deadline:
                raise RuntimeError("warm-up: the workers ran no job in 120 s")
            time.sleep(0.05)
    time.sleep(1.0)


class Enqueuer(threading.Thread):
    """Every ``clients``-th job of the schedule, on its own connection (its own
    adapter): like web requests, several enqueue at once, so one commit's flush
    does not hold up the whole offer."""

    def __init__(self, adapter: Any, first: int, clients: int, n: int, t0: float, limit: float):
        super().__init__(daemon=True)
        self.adapter, self.first, self.clients, self.n = adapter, first, clients, n
        self.t0, self.limit = t0, limit
        self.rows: list[tuple[float, float, float]] = []
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        step = 1.0 / A.rate
        try:
            self.adapter.open()
            for i in range(self.first, self.n, self.clients):  # bounded by count and time
                due = self.t0 + i * step
                if self.stop.wait(max(0.0, due - time.time())):
                    return
                if time.time() > self.limit:
                    self.error = f"{(self.n - i) // self.clients} jobs unsent long after schedule"
                    return
                if time.time() - due > SKIP_LATE:  # an overloaded box: keep time, not count
                    self.rows.append((due, math.nan, math.nan))
                    continue
                ts = time.time()
                self.adapter.enqueue_one(ts)
                self.rows.append((due, ts, (time.time() - ts) * 1000))
        except Exception as exc:  # noqa: BLE001  any client error ends the run, reported below
            self.error = repr(exc)
        finally:
            self.adapter.close()


def offer(peer: Any, procs: list[Any]) -> dict[str, Any]:
    """The fixed-schedule offer, with the hold opened and closed on time."""
    total = A.baseline + A.hold + A.after
    n = int(total * A.rate)
    t0 = time.time() + 0.5  # the enqueuers' connections open first
    t_hold, t_release, t_end = t0 + A.baseline, t0 + A.baseline + A.hold, t0 + total
    limit = t_end + max(30.0, total)
    threads = [
        Enqueuer(peer.Adapter(A.db), k, A.enqueuers, n, t0, limit) for k in range(A.enqueuers)
    ]
    dsn = threads[0].adapter.dsn
    hold = None
    info: dict[str, Any] = {}
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads) and time.time() < limit + 5:
            failed = [t.error for t in threads if t.error]
            if failed:
                raise RuntimeError(f"offer: {failed[0]}")
            benchlib.check_alive(procs)
            now = time.time()
            if hold is None and not info and A.hold > 0 and now >= t_hold:
                hold = psycopg.connect(dsn, autocommit=False)  # BEGIN; an xid; idle
                info = {"txid": int(hold.execute("SELECT txid_current()").fetchone()[0])}
                info["begun"] = time.time()
            elif hold is not None and now >= t_release:
                hold.commit()
                hold.close()
                hold = None
                info["released"] = time.time()
            # wake for the next boundary, else once a second
            nxt = [b for b in (t_hold, t_release) if b > now] + [now + 1.0]
            time.sleep(max(0.0, min(nxt) - time.time()))
        failed = [t.error for t in threads if t.error]
        if failed:
            raise RuntimeError(f"offer: {failed[0]}")
    finally:
        for t in threads:
            t.stop.set()
        for t in threads:
            t.join(timeout=10)
        if hold is not None:  # the offer ended early: never leave the horizon held
            hold.rollback()
            hold.close()
            info["released"] = time.time()
        rows = sorted(r for t in threads for r in t.rows)
        with open(A.sent, "w") as f:
            f.writelines(f"{due!r} {ts!r} {ms:.3f}\n" for due, ts, ms in rows)
    return {
        "t0": t0,
        "t_hold": info.get("begun", t_hold),
        "t_release": info.get("released", t_release),
        "t_end": t_end,
        "hold_txid": info.get("txid"),
        "offered": sum(1 for r in rows if not math.isnan(r[1])),
    }


def main() -> None:
    exit_on_sigterm()  # a SIGTERM from trial.py still stops the workers
    peer = importlib.import_module(f"peer_{A.peer}")
    adapter = peer.Adapter(A.db)
    out: dict[str, Any] = {"peer": A.peer, "version": adapter.version()}
    out["settings"] = adapter.settings()
    adapter.setup()
    adapter.open()
    open(A.started, "w").close()
    procs = benchlib.start_workers(adapter, "trial", {benchlib.LATENCY_FILE_ENV: A.started})
    total = A.baseline + A.hold + A.after
    sampler = Sampler(adapter.dsn, A.tables.split(","), total * 3 + 600)
    try:
        warm_up(adapter, procs)
        sampler.start()
        out.update(offer(peer, procs))
        deadline = time.time() + A.drain_timeout
        while started_count(A.started) < out["offered"] and time.time() < deadline:
            benchlib.check_alive(procs)
            time.sleep(0.2)
        out["drained_s"] = round(time.time() - out["t_end"], 2)
        time.sleep(1.5)  # one more sample after the last job
    finally:
        sampler.stop.set()
        adapter.close()
        benchlib.stop_workers(procs)
    sampler.join(timeout=10)
    out.update(samples=sampler.samples, sampler_error=sampler.error)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
