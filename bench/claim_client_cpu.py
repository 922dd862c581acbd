"""The worker's own CPU for one claim: thread CPU time of ``claim.claim`` taking 300 jobs.

    DJANGO_SETTINGS_MODULE=tests.settings scripts/dev python bench/claim_client_cpu.py [--reps 60]

A drain's worker spends its CPU beside the server's on the same cores, so what the
claim costs in Python (reading 300 rows, decoding them into ``Claimed``) is drain
throughput too. 300 due jobs are claimed, put back to pending and claimed again,
--reps times; the first 10 are warm-up. Prints the median and the minimum of the
claiming thread's CPU time (``time.thread_time``: the server's work and the wait
for it are not in it) per claim and per job.

It needs a migrated database (``migrate`` on DATABASE_URL) and TRUNCATEs the jobs
table there: never point it at a database whose jobs you want to keep.
"""

from __future__ import annotations

import argparse
import statistics
import time

import django

django.setup()

from django.db import connection  # noqa: E402

from django_pgjobs import claim  # noqa: E402
from django_pgjobs.db.tables import JOB  # noqa: E402

N = 300

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument("--reps", type=int, default=60, help="claims measured, after 10 of warm-up")
A = ap.parse_args()
if A.reps < 1:
    raise SystemExit(f"claim_client_cpu: --reps must be >= 1, got {A.reps}")

with connection.cursor() as cursor:
    cursor.execute(f"TRUNCATE {JOB}")
    cursor.execute(
        f"INSERT INTO {JOB} (task, queue, run_at) SELECT 'bench.noop', 'default', now()"
        " FROM generate_series(1, %s)",
        [N],
    )
    cursor.execute(f"VACUUM ANALYZE {JOB}")

cpu: list[float] = []
for _ in range(10 + A.reps):
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB} SET status = 'pending', attempts = 0, worker = NULL,"
            " run_at = now() - interval '1 second'"
        )
    began = time.thread_time()
    got = claim.claim(connection, worker="bench", n=N, queues=["default"])
    cpu.append(time.thread_time() - began)
    if len(got) != N:
        raise SystemExit(f"claim_client_cpu: the claim took {len(got)} of {N} jobs")
measured = cpu[10:]
median, least = statistics.median(measured), min(measured)
print(
    f"claim of {N} jobs, worker's thread CPU over {A.reps} claims: median "
    f"{median * 1e6:,.0f} us ({median / N * 1e6:.1f} us a job), min {least * 1e6:,.0f} us"
)
