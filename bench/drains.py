"""The drain comparison: plain ``runjobs`` vs pgqueuer vs tuned graphile-worker.

``bench/run --drains`` runs the harness's ``driver.py --modes drain --interleave``
(rep 1 of every peer, then rep 2 ...: drift of the box hits every peer alike) for
our adapter at its defaults (2 plain ``runjobs``), pgqueuer as the harness runs it
and graphile-worker with its documented batching (``BENCH_GRAPHILE_TUNED=1``:
concurrency 24, a local queue of 500, batched completions), then prints the
medians and the issue's criteria: ours >= 2x pgqueuer and >= graphile-worker.

graphile-worker is a Node package: the first run does ``npm ci`` in the work
copy's ``node/`` (the pinned ``package-lock.json``), which needs the npm registry.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import exit_on_sigterm, say  # noqa: E402
from cluster import Cluster  # noqa: E402

OURS, PGQ, GRAPHILE = "django_pgjobs", "pgqueuer", "graphile_worker"

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument("--work", required=True, help="the writable harness copy (bench/run sets it)")
ap.add_argument("--reps", type=int, default=5, help="repetitions per peer (medians)")
ap.add_argument("--n", type=int, default=20000, help="jobs per drain")
ap.add_argument(
    "--server",
    choices=["shared", "own"],
    default="shared",
    help="shared: BENCH_PGHOST/PORT (the harness's published numbers); own: a throwaway cluster",
)
A = ap.parse_args()
if A.reps < 1 or A.n < 2:
    raise SystemExit(f"drains: --reps must be >= 1 and --n >= 2, got {A.reps} and {A.n}")
WORK = os.path.abspath(A.work)
OUT = os.path.join(WORK, "out")


def prepare() -> None:
    """The peers' venvs, and graphile-worker's node_modules (npm ci, once)."""
    subprocess.run(["./setup_venvs.sh", PGQ, GRAPHILE], cwd=WORK, check=True)
    cli = os.path.join(WORK, "node", "node_modules", "graphile-worker", "dist", "cli.js")
    if not os.path.exists(cli):
        if shutil.which("npm") is None:
            raise SystemExit("drains: graphile-worker needs node and npm (`npm ci` in node/)")
        say("npm ci in node/ (graphile-worker, pinned)")
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=os.path.join(WORK, "node"))
        if not os.path.exists(cli):
            raise SystemExit(f"drains: `npm ci` in {WORK}/node did not install graphile-worker")


def run_driver(port: str, stamp: str) -> list[dict[str, Any]]:
    env = {**os.environ, "BENCH_GRAPHILE_TUNED": "1", "BENCH_PGPORT": port}
    cmd = [sys.executable, "driver.py", "--peers", f"{OURS},{PGQ},{GRAPHILE}", "--modes"]
    cmd += ["drain", "--reps", str(A.reps), "--interleave", "--n", str(A.n), "--stamp", stamp]
    subprocess.run(cmd, cwd=WORK, env=env, check=True)
    with open(os.path.join(OUT, f"results-{stamp}.json")) as f:
        runs: list[dict[str, Any]] = json.load(f)
    return runs


def report(runs: list[dict[str, Any]], stamp: str, port: str) -> str:
    rates: dict[str, list[float]] = {p: [] for p in (OURS, PGQ, GRAPHILE)}
    foreign: dict[str, float] = dict.fromkeys(rates, 0.0)
    errors = [f"{r['peer']} rep{r['rep']}: {r['error']}" for r in runs if "error" in r]
    for r in runs:
        if "error" not in r:
            rates[r["peer"]].append(r["jobs_per_s"])
            foreign[r["peer"]] = max(foreign[r["peer"]], r.get("foreign_cores") or 0.0)
    med = {p: statistics.median(v) if v else float("nan") for p, v in rates.items()}
    lines = [
        f"## Drain comparison {stamp}",
        "",
        f"{A.n:,} no-op jobs, 2 worker processes, {A.reps} repetitions alternated "
        f"(`driver.py --interleave`), server 127.0.0.1:{port}; medians (min-max).",
        "",
        "| peer | settings | drain jobs/s | foreign load (max cores) |",
        "|---|---|---|---|",
    ]
    how = {
        OURS: "plain `runjobs` (defaults)",
        PGQ: "the harness's (batch_size 100)",
        GRAPHILE: "`BENCH_GRAPHILE_TUNED=1` (concurrency 24, local queue 500, batched completions)",
    }
    for p, v in rates.items():
        spread = f" ({min(v):,.0f}-{max(v):,.0f})" if v else ""
        lines.append(f"| {p} | {how[p]} | {med[p]:,.0f}{spread} | {foreign[p]} |")
    ours = med[OURS]
    lines += [
        "",
        f"- ours / pgqueuer = {ours / med[PGQ]:.2f}x (>= 2.0) -> "
        f"{'PASS' if ours >= 2 * med[PGQ] else 'FAIL'}",
        f"- ours / graphile-worker tuned = {ours / med[GRAPHILE]:.2f}x (>= 1.0) -> "
        f"{'PASS' if ours >= med[GRAPHILE] else 'FAIL'}",
    ]
    if errors:
        lines.append("- errors: " + "; ".join(errors))
    return "\n".join(lines)


def main() -> None:
    exit_on_sigterm()
    os.makedirs(OUT, exist_ok=True)
    prepare()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if A.server == "own":
        with Cluster(name="drains") as cluster:
            port = str(cluster.port)
            runs = run_driver(port, stamp)
    else:
        port = os.environ.get("BENCH_PGPORT", "5432")
        runs = run_driver(port, stamp)
    text = report(runs, stamp, port)
    with open(os.path.join(OUT, f"drains-{stamp}.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text, flush=True)


if __name__ == "__main__":
    main()
