"""Peak memory of a worker running one chord callback over large results.

    DATABASE_URL=... python bench/chord_memory.py MEMBERS SIZE_BYTES [walk|size]

Enqueues a chord of MEMBERS ``blob`` members (each returns SIZE_BYTES of random hex,
stored uncompressed; at most ``MAX_RESULT_BYTES`` as JSON) and a ``walk_results``
callback (it reads every result through the chord's list, then again through
``context.parent_results``; ``size``: ``size_results``, which keeps no result) on a
queue of its own. A plain ``runjobs`` process
serves that queue alone and starts first, so its peak RSS (``VmHWM``) before the
callback is its baseline; another ``runjobs``, at its defaults, runs the members.
Prints the callback worker's peak RSS before and after the callback, the members'
worker's peak, then deletes
the rows it wrote (about MEMBERS x SIZE_BYTES) and vacuums the results. Run it on a
database of its own (``DATABASE_URL``, the test settings).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402 - after the path and settings above

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from django_pgjobs import chord  # noqa: E402
from django_pgjobs.conf import get_settings  # noqa: E402
from tests import workflow_jobs as w  # noqa: E402

QUEUE = "bench-chord-memory"


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def status(job_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT status FROM django_pgjobs_job WHERE id = %s", [job_id])
        return str(cursor.fetchone()[0])


def wait(condition: Any, what: str, timeout: float = 1800.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.2)


def runjobs(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runjobs", "--verbosity", "0", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def cleanup(run_id: int, ids: list[int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_pgjobs_jobresult WHERE job_id = ANY(%s)", [ids])
        cursor.execute("DELETE FROM django_pgjobs_jobdependency WHERE child_id = ANY(%s)", [ids])
        cursor.execute("DELETE FROM django_pgjobs_job WHERE id = ANY(%s)", [ids])
        cursor.execute("DELETE FROM django_pgjobs_workflow WHERE id = %s", [run_id])
        cursor.execute("VACUUM django_pgjobs_jobresult")


CALLBACKS = {"walk": w.walk_results, "size": w.size_results}


def main(members: int, size: int, callback: str = "walk") -> None:
    call_command("migrate", verbosity=0)
    size = min(size, get_settings().MAX_RESULT_BYTES - 2)  # stored as a JSON string: quoted
    callback_worker = runjobs("--queues", QUEUE)
    run = chord(
        [w.blob.s(size, i) for i in range(members)], CALLBACKS[callback].using(queue=QUEUE).s()
    ).enqueue()
    ids = [job.id for job in run.jobs]
    try:
        time.sleep(5)  # the callback's worker has started and is idle
        baseline = vm_hwm_mb(callback_worker.pid)
        started = time.monotonic()
        # a plain runjobs at its defaults runs the members: its peak is the other figure
        member_worker = runjobs("--queues", "default")
        try:
            wait(lambda: status(ids[-1]) != "blocked", "the members to finish")
            failed = [i for i in ids[:-1] if status(i) != "completed"]
            if failed:
                raise RuntimeError(f"{len(failed)} members did not complete, e.g. {failed[0]}")
            members_peak = vm_hwm_mb(member_worker.pid)
        finally:
            stop(member_worker)
        members_took = time.monotonic() - started
        started = time.monotonic()
        wait(lambda: status(ids[-1]) in ("completed", "dead", "cancelled"), "the callback")
        took = time.monotonic() - started
        peak = vm_hwm_mb(callback_worker.pid)
        print(
            f"{members:,} x {size:,} B, {callback} ({members * size / 2**20:,.0f} MiB): callback "
            f"{status(ids[-1])} in {took:.1f} s (members {members_took:.0f} s); worker peak "
            f"RSS {baseline:,.1f} MB before it, {peak:,.1f} MB after "
            f"(+{peak - baseline:,.1f} MB = {(peak - baseline) * 2**20 / size:,.1f} results); "
            f"the members' worker peaked at {members_peak:,.0f} MB"
        )
    finally:
        stop(callback_worker)
        cleanup(run.id, ids)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:4])
