"""An application process for the failover and partition drills: enqueues jobs
one transaction at a time and records each one the database acknowledged.

``python -m tests.faults.enqueuer ACK_FILE STOP_FILE [RATE]``: enqueues
``fault_atomic`` and ``fault_step`` jobs alternately with idempotency keys
``<$PGJOBS_DRILL_PREFIX or drill>-<n>``; an enqueue that fails is retried with the same key (a failover
makes the answer ambiguous: the key makes the retry safe) until it succeeds, then
``<key> <job id> <unix time>`` is appended to ACK_FILE (flushed) — a line there is a
commit the client saw. Stops when STOP_FILE exists.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    import django

    django.setup()
    from django.db import connection

    from tests.testapp.jobs import fault_atomic, fault_step

    ack_path, stop_path = sys.argv[1], sys.argv[2]
    prefix = os.environ.get("PGJOBS_DRILL_PREFIX", "drill")
    pause = 1.0 / float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    n = 0
    with open(ack_path, "a") as ack:
        while not os.path.exists(stop_path):
            definition = fault_atomic if n % 2 == 0 else fault_step
            try:
                job = definition.using(idempotency_key=f"{prefix}-{n}").enqueue()
            except Exception as exc:  # noqa: BLE001 - the database is failing over: retry
                print(
                    f"enqueue {prefix}-{n} failed, retrying: {type(exc).__name__}: {exc}",
                    flush=True,
                )
                connection.close()
                time.sleep(0.2)
                continue
            ack.write(f"{prefix}-{n} {job.id} {time.time():.6f}\n")
            ack.flush()
            n += 1
            if pause:
                time.sleep(pause)
    print(f"enqueuer stopped after {n} acknowledged enqueues", flush=True)


if __name__ == "__main__":
    main()
