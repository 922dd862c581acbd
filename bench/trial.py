"""The held-horizon trial: latency while one open transaction holds VACUUM back.

``bench/run --trial horizon`` starts a throwaway PostgreSQL cluster (autovacuum on,
the server's default settings), then runs each peer in turn on a fresh database:
2 worker processes at the library's defaults, single enqueues offered at RATE/s in
autocommit, each job carrying its enqueue time; the horizon is held by an open
transaction with an xid for HOLD seconds between BASELINE and AFTER seconds of the
same offer. Per WINDOW: p50/p95/max enqueue->start, backlog (offered - started),
dead tuples of the jobs tables; then the issue's criteria, computed and printed.

Output: one markdown table per peer, a side-by-side summary, and under
``<work>/out/``: ``trial-<stamp>.md``, ``trial-<stamp>.json`` (every window, the
samples, the settings) and the raw ``trial-<stamp>-<peer>-{sent,started}.txt``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import exit_on_sigterm, say  # noqa: E402
from cluster import Cluster  # noqa: E402
from trial_windows import as_rows, cut, fill, read_sent, read_started, verdict  # noqa: E402

# The jobs tables of each peer (LIKE patterns), whose dead tuples the trial follows.
TABLES = {"django_pgjobs": "django_pgjobs_%", "pgqueuer": "pgqueuer%"}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument("--work", required=True, help="the writable harness copy (bench/run sets it)")
ap.add_argument("--trial", choices=["horizon"], default="horizon")
ap.add_argument("--peers", default="django_pgjobs,pgqueuer", help="comma list (harness names)")
ap.add_argument("--rate", type=float, default=300.0, help="single enqueues offered per second")
ap.add_argument("--baseline", type=float, default=60.0, help="seconds before the hold")
ap.add_argument("--hold", type=float, default=600.0, help="seconds the horizon is held")
ap.add_argument("--after", type=float, default=120.0, help="seconds after the release")
ap.add_argument("--window", type=float, default=None, help="seconds per reported window (10)")
ap.add_argument(
    "--pgqueuer-batch",
    default="10",
    help="pgqueuer's batch_size (10 = its default; the harness's drain runs use 100)",
)
ap.add_argument(
    "--enqueuers",
    type=int,
    default=4,
    help="connections sharing the offer (one commit's flush must not delay the schedule)",
)
ap.add_argument("--drain-timeout", type=float, default=30.0, help="wait for the last jobs")
ap.add_argument(
    "--server-setting",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="a postgresql.conf line for the trial's cluster, e.g. log_autovacuum_min_duration=0\n"
    "(repeatable; the report lists them; every other setting stays the server's default)",
)
ap.add_argument("--smoke", action="store_true", help="ours only, ~40 s, for CI: checks the record")
ap.add_argument(
    "--from-json",
    metavar="PATH",
    help="run nothing: cut a past run's out/trial-<stamp>.json again (e.g. with another --window)",
)
A = ap.parse_args()
if A.window is None and not A.from_json:
    A.window = 10.0
if A.smoke:
    A.peers, A.rate, A.baseline, A.hold, A.after, A.window = "django_pgjobs", 100, 6, 9, 6, 3
    A.drain_timeout = 15.0
for name, value in (("--rate", A.rate), ("--window", A.window), ("--enqueuers", A.enqueuers)):
    if value is not None and not value > 0:
        raise SystemExit(f"trial: {name} must be > 0, got {value}")
for name, value in (("--baseline", A.baseline), ("--hold", A.hold), ("--after", A.after)):
    if not value >= 0:
        raise SystemExit(f"trial: {name} must be >= 0, got {value}")
SERVER_SETTINGS: dict[str, str] = {}
for line in A.server_setting:
    name, sep, value = line.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise SystemExit(f"trial: --server-setting must be NAME=VALUE, got {line!r}")
    SERVER_SETTINGS[name.strip()] = value.strip()
if A.window is not None and A.baseline < A.window:
    raise SystemExit("trial: --baseline must hold at least one --window (the criteria need it)")

WORK = os.path.abspath(A.work)
os.chdir(WORK)
sys.path[:0] = [WORK]
import driver  # noqa: E402  (the harness's: peers, their venvs, the foreign-load sampler)
import psycopg  # noqa: E402

OUT = os.path.join(WORK, "out")
PEERS = [p for p in A.peers.split(",") if p]
unknown = [p for p in PEERS if p not in TABLES]
if unknown:
    raise SystemExit(f"trial: no jobs-table pattern for {unknown}; known: {sorted(TABLES)}")


class TrialLoad(driver.ForeignLoad):
    """The harness's foreign-CPU sampler; every process of our cluster is ours."""

    def __init__(self, title: str):
        super().__init__()
        self.title = title

    def _is_bench(self, pid: int, procs: dict[int, Any]) -> bool | None:
        if procs[pid][2].startswith(self.title):
            return True
        result: bool | None = super()._is_bench(pid, procs)
        return result


def venv_python(peer: str) -> str:
    found = driver.discover()
    if peer not in found:
        raise SystemExit(f"trial: no peers/peer_{peer}.py in {WORK}")
    if not os.path.exists(found[peer]["python"]):
        subprocess.run(["./setup_venvs.sh", peer], check=True, stdout=subprocess.DEVNULL)
    return str(found[peer]["python"])


def run_peer(cluster: Cluster, peer: str, stamp: str, load: TrialLoad) -> dict[str, Any]:
    db = f"bench_trial_{peer}"
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {db}")
    sent = os.path.join(OUT, f"trial-{stamp}-{peer}-sent.txt")
    started = os.path.join(OUT, f"trial-{stamp}-{peer}-started.txt")
    total = A.baseline + A.hold + A.after
    cmd = [venv_python(peer), os.path.join(HERE, "trial_peer.py"), "--peer", peer, "--db", db]
    cmd += ["--rate", str(A.rate), "--baseline", str(A.baseline), "--hold", str(A.hold)]
    cmd += ["--after", str(A.after), "--tables", TABLES[peer], "--sent", sent]
    cmd += ["--started", started, "--drain-timeout", str(A.drain_timeout)]
    cmd += ["--enqueuers", str(A.enqueuers)]
    env = {
        **os.environ,
        "BENCH_PGHOST": "127.0.0.1",
        "BENCH_PGPORT": str(cluster.port),
        "BENCH_PGUSER": "postgres",
        "BENCH_PGQUEUER_BATCH": A.pgqueuer_batch,
    }
    say(f"{peer}: {A.baseline:g} s before, {A.hold:g} s held, {A.after:g} s after, {A.rate:g}/s")
    f0, _ = load.snapshot()
    t_run = time.time()
    loadavg = os.getloadavg()[0]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = "", f"timed out after {total * 2 + 300:.0f} s"
    try:
        stdout, stderr = proc.communicate(timeout=total * 2 + 300)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:  # timed out, or we are being stopped
            proc.terminate()  # trial_peer.py stops its workers on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        driver.reap_leftover_workers()  # workers of a child that could not stop them
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    lines = [x for x in stdout.splitlines() if x.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"trial: {peer} failed (rc {proc.returncode}):\n{stderr[-3000:]}")
    rec: dict[str, Any] = json.loads(lines[-1])
    f1, _ = load.snapshot()
    rec["foreign_cores"] = round((f1 - f0) / max(1e-3, time.time() - t_run), 3)
    rec["loadavg1_before"] = loadavg
    rec["files"] = {"sent": sent, "started": started}
    analyse(rec)
    return rec


def analyse(rec: dict[str, Any]) -> None:
    """Windows and verdict of one peer's record (its raw files), in place."""
    # Windows follow the schedule; the hold itself began and ended within a job of it.
    t0 = rec["t0"]
    release = A.baseline + A.hold
    windows = cut(t0, [t0, t0 + A.baseline, t0 + release, rec["t_end"]], A.window)
    first_start, repeats = read_started(rec["files"]["started"])
    fill(windows, t0, read_sent(rec["files"]["sent"]), first_start, rec["samples"])
    rec["verdict"] = verdict(windows, A.rate, release)
    rec["verdict"]["handler_repeats"] = repeats
    rec["windows"] = as_rows(windows)


def ms(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def peer_table(rec: dict[str, Any]) -> list[str]:
    v = rec["verdict"]
    md = [
        f"### {rec['peer']} {rec['version']}",
        "",
        "| phase | window s | offered | unstarted | p50 ms | p95 ms | max ms "
        "| backlog max | dead tuples max | live tuples | autovacuums | enqueue p95 ms "
        "| p95 ms from commit | skipped (> 1 s late) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in rec["windows"]:
        md.append(
            f"| {w['phase']} | {w['start']:g}-{w['end']:g} | {w['offered']} "
            f"| {w['offered'] - w['started']} | {ms(w['p50_ms'])} | {ms(w['p95_ms'])} "
            f"| {ms(w['max_ms'])} | {w['backlog_max']} | {w['dead_max']:,} | {w['live_last']:,} "
            f"| {w['autovacuums']} | {ms(w['enqueue_p95_ms'])} | {ms(w['after_commit_p95_ms'])} "
            f"| {w['skipped']} |"
        )
    base = v["baseline_p95_ms"]
    rec_s = v["recovered_after_s"]
    md += [
        "",
        f"- baseline p95 (median of the windows before the hold): {ms(base)} ms; "
        f"the worst baseline window is {v['baseline_spread']:.2f}x of it",
        f"- every window's p95 <= min(3 x baseline, 50 ms) = {ms(v['p95_limit_ms'])} ms: "
        f"worst {ms(v['worst_p95_ms'])} ms ({v['worst_window']}) -> "
        f"{'PASS' if v['p95_ok'] else 'FAIL'}",
        "- the same, measured from the enqueue's commit (the queue's own share; informational):"
        f" <= {ms(v['from_commit_limit_ms'])} ms: worst {ms(v['from_commit_worst_p95_ms'])} ms"
        f" -> {'PASS' if v['from_commit_ok'] else 'FAIL'}",
        f"- backlog never above one second of arrivals ({A.rate:g}): most {v['backlog_max']} "
        f"({v['backlog_window']}) -> {'PASS' if v['backlog_ok'] else 'FAIL'}",
        "- p95 back within 1.2x of baseline within 60 s of release: "
        + (f"from +{rec_s:g} s on" if rec_s is not None else "never in the after phase")
        + f" -> {'PASS' if v['recovery_ok'] else 'FAIL'}",
        f"- the offer kept its rate: {v['skipped']:,} jobs skipped for being over 1 s late"
        f" (<= 1 %), at most {v['offer_lag_max_ms']:,.0f} ms late"
        + (
            " -> yes"
            if v["offer_on_time"]
            else " -> NO: the enqueuers could not keep the rate; judge nothing from this run"
        ),
        f"- the horizon was held (txid {rec['hold_txid']}) from +{rec['t_hold'] - rec['t0']:.3f} s"
        f" to +{rec['t_release'] - rec['t0']:.3f} s",
        f"- jobs: {v['offered']:,} offered, {v['started']:,} started"
        f" ({v['handler_repeats']} handler repeats); foreign load {rec['foreign_cores']} cores,"
        f" load average {rec['loadavg1_before']:.2f} at the start",
    ]
    return md


def summary(recs: list[dict[str, Any]]) -> list[str]:
    md = [
        "| peer | baseline p95 ms | worst p95 ms (window) | limit ms | from commit: baseline "
        "/ worst p95 ms | max backlog | recovered after | dead tuples max "
        "| p95 / backlog / recovery | offer on time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        v = r["verdict"]
        dead = max((w["dead_max"] for w in r["windows"]), default=0)
        flags = " / ".join("PASS" if v[k] else "FAIL" for k in ("p95_ok", "backlog_ok"))
        flags += " / " + ("PASS" if v["recovery_ok"] else "FAIL")
        rec_s = v["recovered_after_s"]
        md.append(
            f"| {r['peer']} {r['version']} | {ms(v['baseline_p95_ms'])} "
            f"| {ms(v['worst_p95_ms'])} ({v['worst_window']}) | {ms(v['p95_limit_ms'])} "
            f"| {ms(v['from_commit_baseline_p95_ms'])} / {ms(v['from_commit_worst_p95_ms'])} "
            f"| {v['backlog_max']} | {'-' if rec_s is None else f'{rec_s:g} s'} "
            f"| {dead:,} | {flags} | {'yes' if v['offer_on_time'] else 'NO'} |"
        )
    return md


def clean(obj: Any) -> Any:
    """NaN -> null, so the JSON is standard."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean(v) for v in obj]
    return obj


def smoke_check(recs: list[dict[str, Any]]) -> None:
    """What the smoke asserts: a complete record, not a speed."""
    for r in recs:
        v = r["verdict"]
        phases = {w["phase"] for w in r["windows"] if w["offered"]}
        problems = [
            f"{v['offered'] - v['started']} of {v['offered']} jobs never started"
            if not v["all_started"]
            else "",
            "" if phases == {"before", "during", "after"} else f"jobs only in phases {phases}",
            "" if r.get("hold_txid") else "the horizon was never held",
            "" if r["samples"] else f"no table samples ({r.get('sampler_error')})",
        ]
        problems = [p for p in problems if p]
        if problems:
            raise SystemExit(f"trial smoke: {r['peer']}: " + "; ".join(problems))


def run() -> tuple[str, dict[str, str], list[dict[str, Any]]]:
    """Every peer through the trial on a cluster of its own."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    recs: list[dict[str, Any]] = []
    with Cluster(name="trial", settings=SERVER_SETTINGS) as cluster:
        load = TrialLoad(cluster.title)
        load.start()
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            server = {
                k: conn.execute(f"SHOW {k}").fetchone()[0]
                for k in ("server_version", "autovacuum", "autovacuum_naptime", "fsync")
            }
            # what --server-setting changed, as the server reports it
            set_here = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in SERVER_SETTINGS}
            if set_here:
                server["set"] = ", ".join(f"{k} = {v}" for k, v in set_here.items())
        say(f"cluster on 127.0.0.1:{cluster.port}: {server}")
        try:
            for peer in PEERS:
                recs.append(run_peer(cluster, peer, stamp, load))
                print("\n".join(["", *peer_table(recs[-1]), ""]), flush=True)
        finally:
            cluster.save_log(os.path.join(OUT, f"trial-{stamp}-server.log"))
    return stamp, server, recs


def reread(path: str) -> tuple[str, dict[str, str], list[dict[str, Any]]]:
    """A past run's record, cut again (``--window`` may differ; the phases may not)."""
    with open(path) as f:
        old = json.load(f)
    for key in ("rate", "baseline", "hold", "after", "enqueuers", "pgqueuer_batch"):
        setattr(A, key, old["settings"][key])
    if A.window is None:
        A.window = old["settings"]["window"]
    for rec in old["peers"]:
        analyse(rec)
    stamp = os.path.basename(path).removeprefix("trial-").removesuffix(".json") + "-re"
    return stamp, old["server"], old["peers"]


def main() -> None:
    exit_on_sigterm()
    os.makedirs(OUT, exist_ok=True)
    t_all = time.time()
    stamp, server, recs = reread(A.from_json) if A.from_json else run()
    head = [
        f"## Held-horizon trial {stamp}",
        "",
        f"{A.rate:g} single enqueues/s offered; {A.baseline:g} s before, {A.hold:g} s held "
        f"(`BEGIN; SELECT txid_current()` idle in its transaction), {A.after:g} s after; "
        f"{A.window:g} s windows; {A.enqueuers} connections share the offer; "
        f"2 worker processes per peer at their defaults "
        f"(pgqueuer batch_size {A.pgqueuer_batch}); own cluster: PostgreSQL "
        f"{server['server_version']}, autovacuum {server['autovacuum']} "
        f"(naptime {server['autovacuum_naptime']}), fsync {server['fsync']}; "
        f"{os.cpu_count()} cores"
        + (f"; set for this run: {server['set']}." if server.get("set") else "."),
        "",
    ]
    md = head + summary(recs) + [""]
    for r in recs:
        md += [*peer_table(r), ""]
    text = "\n".join(md)
    if A.from_json:
        print(text, flush=True)
    else:
        print("\n" + "\n".join(head + summary(recs)), flush=True)
    with open(os.path.join(OUT, f"trial-{stamp}.md"), "w") as f:
        f.write(text + "\n")
    settings = {k: v for k, v in vars(A).items() if k not in ("work", "from_json")}
    with open(os.path.join(OUT, f"trial-{stamp}.json"), "w") as f:
        json.dump(clean({"settings": settings, "server": server, "peers": recs}), f, indent=1)
    say(f"report: out/trial-{stamp}.md, raw: out/trial-{stamp}.json; {time.time() - t_all:.0f} s")
    if A.smoke:
        smoke_check(recs)


if __name__ == "__main__":
    main()
