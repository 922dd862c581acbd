"""CI's driver over .ci/legs.toml, the table of what each leg runs and why (.ci/run starts
it; standard library only: it runs before any venv exists). `--all`: the runs of
`scripts/dev test --all` instead, one a line: NAME|WHY IT IS SKIPPED HERE|PYTEST ARGS."""

import contextlib
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "artifacts" / "ci"
TABLE = tomllib.loads((ROOT / ".ci" / "legs.toml").read_text())
LIGHTER = {"PGJOBS_PROPERTY_SCALE": "0.4", "PGJOBS_DEADLOCK_SECONDS": "10"}
START = time.monotonic()
DB = "postgres://postgres@127.0.0.1:5432/ci_"  # each leg its own database
Pair = tuple[str, str]
Time = tuple[str, int, int, float]  # leg, exit status, seconds, CPU seconds


def at() -> str:
    return f"[{int(time.monotonic() - START)}s]"


def step(message: str) -> None:
    print(f"\n=== {at()} {message}", flush=True)


def pair_env(pair: Pair) -> dict[str, str]:
    """scripts/dev's PYTHON and DJANGO for a pair such as ("3.11", "5.2")."""
    python, django = pair
    major, minor = django.split(".")
    return {"PYTHON": f"python{python}", "DJANGO": f"Django>={django},<{major}.{int(minor) + 1}"}


def words(args: list[str], workers: str = "2") -> list[str]:
    """The table's words: "@name" is selection `name`, "{logs}" artifacts/ci."""
    fill = lambda a: a.replace("{logs}", str(LOGS)).replace("{workers}", workers)  # noqa: E731
    selected = [TABLE["selections"][a[1:]] if a[0] == "@" else [fill(a)] for a in args]
    return [word for group in selected for word in group]


def missing(need: str) -> str | None:
    """Why this machine cannot run what needs `need`, or None."""
    if need == "pg_basebackup":
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_basebackup"))
        ok = bool(found) and os.access(found[-1], os.X_OK)
        return None if ok else "no pg_basebackup among the PostgreSQL server binaries"
    if need == "netns":
        ok = os.geteuid() == 0 and bool(shutil.which("ip"))
        ok = ok and subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0
        return None if ok else "needs root and iproute2 network namespaces (ip netns)"
    return None if (ROOT / need).exists() else f"no {need}"


def run(cmd: list[str], env: dict[str, str], out: IO[Any]) -> tuple[int, float]:
    """Run `cmd` into `out`: its exit status (128 + N when signal N ended it) and the CPU
    seconds it and the children it waited for used (PostgreSQL's backends aside)."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    return (rc if rc >= 0 else 128 - rc), usage.ru_utime + usage.ru_stime


class Venvs:
    """One scripts/dev venv per pair, built once (a failure is retried once); the legs
    wait for theirs. The builds run in sessions of their own, so that a subset run
    (CI_LEGS) or an early failure stops them, and pip under them, when it ends."""

    def __init__(self) -> None:
        self.builds: dict[Pair, Future[bool]] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = False

    def start(self, pool: ThreadPoolExecutor, pairs: list[dict[str, Any]]) -> None:
        for p in pairs:
            key = (p["python"], p["django"])
            self.builds[key] = pool.submit(self.build, key, p.get("python_stamp", False))

    def build(self, pair: Pair, python_stamp: bool) -> bool:
        # scripts/dev test and scripts/dev python keep separate install stamps (the
        # first adds playwright): every stamp a leg uses is made here, so no leg installs.
        script = "scripts/dev test --version >/dev/null"
        script += " && scripts/dev python -c 'import coverage, xdist'" if python_stamp else ""
        path = LOGS / f"venv-python{pair[0]}-{pair[1]}.log"
        with path.open("wb") as log:
            for attempt in (1, 2):  # pip is mostly network: once more after a failure
                if self.stopping:
                    return False
                proc = subprocess.Popen(
                    ["bash", "-c", script], cwd=ROOT, env={**os.environ, **pair_env(pair)},
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
                self.procs.append(proc)
                if self.stopping:
                    self.stop()
                if proc.wait() == 0:
                    return True
                time.sleep(5 if attempt == 1 else 0)
        if not self.stopping:
            print(path.read_text(errors="replace") + f"FAILED: venv {pair}", flush=True)
        return False

    def stop(self) -> None:
        self.stopping = True
        for proc in list(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def leg_env(leg: dict[str, Any]) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": DB + leg["name"]}
    env.update(LIGHTER if leg.get("lighter") else {})
    env.update({key: words([value])[0] for key, value in leg.get("env", {}).items()})
    if leg.get("coverage"):
        env["COVERAGE_FILE"] = str(LOGS / f".coverage.{leg['name']}")
    for var in leg.get("unset", []):
        env.pop(var, None)
    return env


def run_leg(leg: dict[str, Any], venvs: Venvs) -> tuple[int, float]:
    """The leg's runs in order into its log, up to the first that fails: its exit status
    and CPU seconds."""
    rc, cpu, env = 0, 0.0, leg_env(leg)
    with (
        (LOGS / f"{leg['name']}.log").open("w") as log,
        tempfile.TemporaryDirectory(
            prefix=f"ci-{leg['name']}.", dir="/tmp", ignore_cleanup_errors=True
        ) as tmp,
    ):
        if leg.get("own_tmpdir"):
            os.chmod(tmp, 0o755)
            env["TMPDIR"] = tmp
        log.writelines(line + "\n" for line in leg.get("say", []))
        for each in leg["run"]:
            if "what" in each:
                log.write(f"--- {each['name']}: {each['what']}\n")
            if why := missing(each["needs"]) if "needs" in each else None:
                log.write(f"SKIPPED {each['name']}: {why}\n")
                continue
            log.flush()
            pair = (each.get("python", leg.get("python")), each.get("django", leg.get("django")))
            if pair[0] and not (pair in venvs.builds and venvs.builds[pair].result()):
                log.write(f"FAILED: no venv for {pair}\n")
                rc = 1
                break
            run_env = {**env, **(pair_env(pair) if pair[0] else {})}
            cmd = ["scripts/dev", *words(each["dev"])] if "dev" in each else words(each["cmd"])
            rc, used = run(cmd, run_env, log)
            cpu += used
            if rc:
                break
    return rc, cpu


def run_legs(legs: list[dict[str, Any]], jobs: int, venvs: Venvs) -> list[Time]:
    """The legs, `jobs` at a time; a leg's tail is printed when it passes, more if not."""
    ended: Queue[tuple[str, int, float]] = Queue()
    started: dict[str, float] = {}
    times: list[Time] = []

    def finish() -> None:
        name, rc, cpu = ended.get()
        secs = int(time.monotonic() - started.pop(name))
        times.append((name, rc, secs, cpu))
        lines = (LOGS / f"{name}.log").read_text(errors="replace").splitlines()
        end = f"FAILED (exit {rc}) after {secs}s; its log (last 400 lines)" if rc else ""
        print(f"--- {at()} leg {name} {end or f'passed in {secs}s; its last lines'}:")
        tail = lines[-400:] if rc else lines[-4:]
        print("".join(f"[{name}] {line}\n" for line in tail), end="", flush=True)

    for leg in legs:
        while len(started) >= jobs:
            finish()
        started[leg["name"]] = time.monotonic()
        leg_run = lambda leg=leg: ended.put((leg["name"], *run_leg(leg, venvs)))  # noqa: E731
        threading.Thread(target=leg_run, daemon=True).start()
        print(f"--- {at()} leg {leg['name']} started (log: artifacts/ci/{leg['name']}.log)")
    while started:
        finish()
    return times


def coverage(legs: list[dict[str, Any]], pair: Pair) -> bool:
    """Combine the legs' coverage; False under pyproject.toml's fail_under."""
    env = {**os.environ, "COVERAGE_FILE": str(LOGS / ".coverage"), **pair_env(pair)}
    cov = ["scripts/dev", "python", "-m", "coverage"]
    data = [str(p) for leg in legs if (p := LOGS / f".coverage.{leg['name']}").exists()]
    if not data:
        print("no coverage data (the main leg failed before writing it)")
        return False
    subprocess.run([*cov, "combine", "--keep", "-q", *data], cwd=ROOT, env=env, check=True)
    with (LOGS / "coverage.txt").open("w") as out:
        rc, _ = run([*cov, "report", "--sort=-cover"], env, out)  # exits 2 under the floor
    lines = (LOGS / "coverage.txt").read_text().splitlines()
    print("the 15 least covered modules (all: artifacts/ci/coverage.txt):")
    print("\n".join(lines[:2] + [x for x in lines if x.startswith("django_pgjobs")][-15:]))
    print("\n".join(x for x in lines if re.search("^TOTAL|fail-under|less than", x)))
    if rc:
        print(f"coverage under the floor (exit {rc})")
    return rc == 0


def summary(times: list[Time]) -> None:
    step("leg times (seconds)")
    for name, rc, secs, cpu in sorted(times, key=lambda t: -t[2]):
        print(f"  {name:<18} {secs:5}s  {'FAILED' if rc else 'passed'}  CPU {int(cpu)}s")
    counts = dict.fromkeys(("passed", "failed", "skipped", "error"), 0)
    for log in sorted(LOGS.glob("*.log")):  # the pytest closing lines, added up
        for line in log.read_text(errors="replace").splitlines():
            if re.match(r"=+ .* in [0-9.]+s", line):
                for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", line):
                    counts[word] += int(n)
    failed = counts["failed"] + counts["error"]
    print(f"tests: {counts['passed']} passed, {failed} failed, {counts['skipped']} skipped")


def ci() -> int:
    # A shell starts background commands with SIGINT and SIGQUIT ignored, and an ignored
    # signal is inherited through exec down to the runjobs and reap_jobs processes that
    # tests stop with SIGINT; a handled or default one is reset to the default there.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    os.environ["DATABASE_URL"] = DB + "setup"
    by_name = {leg["name"]: leg for leg in TABLE["leg"]}
    chosen = os.environ.get("CI_LEGS", "").split() or ["demo", *by_name]
    if unknown := set(chosen) - {"demo", *by_name}:
        sys.exit(f"CI_LEGS: no leg {' '.join(unknown)} (there are: demo {' '.join(by_name)})")
    legs = [by_name[name] for name in chosen if name != "demo"]
    jobs = int(os.environ.get("CI_JOBS", "3"))
    shutil.rmtree(LOGS, ignore_errors=True)
    LOGS.mkdir(parents=True)
    for absent in TABLE["absent"]:
        if not shutil.which(python := f"python{absent['python']}"):
            why = f"{python} is not installed on this machine"
            print(f"SKIPPED Python {absent['python']} ({absent['what']}): {why}")
    step(f"venvs for the {len(TABLE['pair'])} Python x Django pairs (logs: artifacts/ci/venv-*)")
    venvs, background = Venvs(), ThreadPoolExecutor(2)
    try:
        with ThreadPoolExecutor(2) as first:  # the first two side by side, before the legs
            venvs.start(first, TABLE["pair"][:2])
        if not next(iter(venvs.builds.values())).result():
            return 1  # the demo and most legs run on it (the second's legs fail, saying why)
        venvs.start(background, TABLE["pair"][2:])
        times: list[Time] = []
        if "demo" in chosen:  # before the legs: see legs.toml
            step("demo on the embedded server")
            t0 = time.monotonic()
            rc, cpu = run_leg({"name": "demo", "run": [TABLE["demo"]], **TABLE["demo"]}, venvs)
            text = (LOGS / "demo.log").read_text(errors="replace")
            print(text + "FAILED: demo" if rc else "\n".join(text.splitlines()[-3:]), flush=True)
            if rc:
                return 1
            times.append(("demo", 0, int(time.monotonic() - t0), cpu))
        step(f"legs, {jobs} at a time: {' '.join(leg['name'] for leg in legs)}")
        times += run_legs(legs, jobs, venvs)
        failed = [name for name, rc, _, _ in times if rc]
        if (after := by_name[TABLE["coverage"]["after"]]) in legs:
            measured = [leg for leg in legs if leg.get("coverage")]
            step(f"coverage of django_pgjobs, in-process: {' '.join(m['name'] for m in measured)}")
            if not coverage(measured, (after["python"], after["django"])):
                failed.append("coverage")
        summary(times)
        if failed:
            step(f"FAILED: {' '.join(failed)} (logs in artifacts/ci/)")
            return 1
        step(f"all green in {int(time.monotonic() - START)}s")
        return 0
    finally:
        venvs.stop()
        background.shutdown(cancel_futures=True)


def dev_all() -> None:
    """`scripts/dev test --all`'s runs, one a line, for scripts/dev to make."""
    workers = os.environ.get("TEST_WORKERS", "2")
    for each in TABLE["all"]:
        why = missing(each["needs"]) if "needs" in each else None
        print(f"{each['name']}|{why or ''}|{shlex.join(words(each['args'], workers))}")


if __name__ == "__main__":
    sys.exit(dev_all() if sys.argv[1:] == ["--all"] else ci())
