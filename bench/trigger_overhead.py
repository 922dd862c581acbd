"""What the workflow trigger costs a plain drain: the same no-op drain, interleaved,
for several code roots and with the trigger on or off.

    scripts/dev python bench/trigger_overhead.py --n 50000 --rounds 3 \\
        --variant main=/work/main --variant branch=. --variant branch-off=.:off

Each variant is ``NAME=ROOT[:off]``: the package is imported from ROOT, with ROOT's
own ``scripts/dev`` virtualenv for this Python and Django when it has one (an
editable install wins over PYTHONPATH; no .pyc is written), its migrations build a fresh database, N
no-op jobs are enqueued (``enqueue_many``), and two plain ``runjobs --burst``
processes (the bench adapter's settings, bench/peers/dj_pgjobs) drain them. ``:off``
disables the trigger (ALTER TABLE ... DISABLE TRIGGER) before the drain. Reported
per variant: drain jobs/s, PostgreSQL CPU µs per job (the backends of that
database, from /proc, sampled every 50 ms) and worker CPU µs per job, as the median
(min-max) over the rounds, and against the first variant the median of the
per-round differences (rounds alternate the order of the variants). On a shared
box, read the spread before the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
#: the shared peer harness (its benchlib holds the no-op job's body), as bench/run finds it
HARNESS = Path(os.environ.get("BENCH_HARNESS", HERE.parent.parent / "shared" / "bench"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def backends(db: str) -> list[int]:
    """PostgreSQL backend processes serving ``db`` (from their command lines)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmd.startswith("postgres:") and f" {db} " in cmd:
            pids.append(int(entry.name))
    return pids


def python_for(root: Path) -> str:
    """ROOT's scripts/dev virtualenv of this interpreter's Python and Django, if any."""
    import django

    venv = (
        root
        / f".venv-{sys.version_info[0]}.{sys.version_info[1]}-dj{django.VERSION[0]}.{django.VERSION[1]}"
    )
    return str(venv / "bin" / "python") if (venv / "bin" / "python").exists() else sys.executable


def env_for(root: Path, db: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{root}:{PEERS}:{HARNESS}",
        "PYTHONDONTWRITEBYTECODE": "1",
        "DJANGO_SETTINGS_MODULE": "dj_pgjobs.settings",
        "BENCH_DB": db,
    }


def run(args: list[str], env: dict[str, str]) -> str:
    # cwd: the peers folder, so `python -c` does not import the package from here
    proc = subprocess.run(args, env=env, cwd=PEERS, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def drain(name: str, root: Path, trigger_off: bool, n: int, dsn: str) -> dict[str, float]:
    db = f"bench_wf_{name.replace('-', '_')}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {db}")
    env = env_for(root, db)
    py = python_for(root)
    where = run([py, "-c", "import django_pgjobs; print(django_pgjobs.__file__)"], env).strip()
    if not where.startswith(str(root)):
        raise SystemExit(f"{name}: imported django_pgjobs from {where}, not from {root}")
    run([py, "-m", "django", "migrate", "-v", "0"], env)
    run(
        [
            py,
            "-c",
            "import django; django.setup(); from dj_pgjobs.jobs import noop; "
            f"noop.enqueue_many([()] * {n})",
        ],
        env,
    )
    with psycopg.connect(dsn.replace("dbname=postgres", f"dbname={db}"), autocommit=True) as conn:
        if trigger_off:
            conn.execute("ALTER TABLE django_pgjobs_job DISABLE TRIGGER pgjobs_workflow_step")
        conn.execute("VACUUM ANALYZE django_pgjobs_job")
    seen: dict[int, float] = {}
    start = time.perf_counter()
    workers = [
        subprocess.Popen(
            [py, "-m", "django", "runjobs", "--burst", "--verbosity", "0"],
            env=env,
            cwd=PEERS,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    worker_cpu: dict[int, float] = {}
    while any(w.poll() is None for w in workers):
        for pid in backends(db):
            used = cpu_seconds(pid)
            if used is not None:
                seen[pid] = max(seen.get(pid, 0.0), used)
        for w in workers:
            used = cpu_seconds(w.pid)
            if used is not None:
                worker_cpu[w.pid] = max(worker_cpu.get(w.pid, 0.0), used)
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    with psycopg.connect(dsn.replace("dbname=postgres", f"dbname={db}"), autocommit=True) as conn:
        done = conn.execute(
            "SELECT count(*) FROM django_pgjobs_job WHERE status = 'completed'"
        ).fetchone()[0]
    if done != n:
        raise SystemExit(f"{name}: {done} of {n} jobs completed")
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    return {
        "jobs_s": n / elapsed,
        "pg_us": sum(seen.values()) * 1e6 / n,
        "worker_us": sum(worker_cpu.values()) * 1e6 / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", required=True, help="NAME=ROOT[:off]")
    parser.add_argument("--dsn", default="host=127.0.0.1 user=postgres dbname=postgres")
    options = parser.parse_args()
    variants = []
    for item in options.variant:
        name, _, spec = item.partition("=")
        root, _, flag = spec.partition(":")
        variants.append((name, Path(root).resolve(), flag == "off"))
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in variants}
    for round_ in range(options.rounds):
        # interleaved, and every other round in reverse order: a load that drifts
        # during the run hits every variant alike
        order = variants if round_ % 2 == 0 else variants[::-1]
        for name, root, off in order:
            results[name].append(drain(name, root, off, options.n, options.dsn))
            load = os.getloadavg()[0]
            r = results[name][-1]
            print(
                f"round {round_ + 1} {name}: {r['jobs_s']:,.0f} jobs/s, PostgreSQL "
                f"{r['pg_us']:.1f} us/job, workers {r['worker_us']:.1f} us/job (load {load:.1f})",
                flush=True,
            )
    print("\n| variant | drain jobs/s | PostgreSQL CPU µs/job | worker CPU µs/job |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cells = []
        for key, fmt in (("jobs_s", "{:,.0f}"), ("pg_us", "{:.1f}"), ("worker_us", "{:.1f}")):
            values = [r[key] for r in runs]
            cells.append(
                f"{fmt.format(statistics.median(values))} "
                f"({fmt.format(min(values))}-{fmt.format(max(values))})"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    first = variants[0][0]
    for name in list(results)[1:]:
        diffs = [
            b["pg_us"] - a["pg_us"] for a, b in zip(results[first], results[name], strict=True)
        ]
        print(
            f"PostgreSQL CPU, {name} minus {first}, per round: "
            + ", ".join(f"{d:+.1f}" for d in diffs)
            + f" µs/job (median {statistics.median(diffs):+.1f})"
        )


if __name__ == "__main__":
    main()
