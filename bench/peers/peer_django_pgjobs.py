"""django_pgjobs adapter: drives only the public API and ``manage.py runjobs``.

# bench-venv: pgjobs  python=python3.11  pip=-e ${PGJOBS_SRC} psycopg[binary]

(``bench/run`` in the django-pgjobs repository provides ``.venv/pgjobs``: the
project installed in editable mode; ``setup_venvs.sh`` cannot expand the source
path above, so run this adapter through ``bench/run``.)

Settings: peers/dj_pgjobs/settings.py (PostgreSQL, psycopg 3, CONN_MAX_AGE=None,
logging at WARNING). Job: peers/dj_pgjobs/jobs.py (``@job def noop(ts=None)``).
Enqueue: ``noop.enqueue_many([()] * n)`` (COPY in batches, one transaction);
single: ``noop.enqueue(ts)`` in autocommit. Worker: 2 processes of plain
``python -m django runjobs`` — no flags, Django's default (client-side) binding —
unless the knobs below ask for tuning (``BENCH_PGJOBS_CONCURRENCY``,
``BENCH_PGJOBS_BATCH``, ``BENCH_PGJOBS_QUEUES``, ``BENCH_PGJOBS_PREPARE=1`` for
Django's ``server_side_binding`` + ``prepare_threshold``, ``BENCH_PGJOBS_EXTRA``).
io mode: ``@job def io_sync()`` / ``@job async def io_async()`` run by plain
``runjobs`` (defaults: 8 threads; 100 async slots on one event loop).
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version as _pkg_version

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

WORKERS = int(os.environ.get("BENCH_PGJOBS_WORKERS", "2"))
CONCURRENCY = os.environ.get("BENCH_PGJOBS_CONCURRENCY", "")  # "": runjobs' default
BATCH = os.environ.get("BENCH_PGJOBS_BATCH", "")
QUEUES = os.environ.get("BENCH_PGJOBS_QUEUES", "")
LISTEN = os.environ.get("BENCH_PGJOBS_LISTEN", "1") == "1"
POLL = float(os.environ.get("BENCH_PGJOBS_POLL", "1.0"))
EXTRA = os.environ.get("BENCH_PGJOBS_EXTRA", "").split()


class Adapter(benchlib.Adapter):
    name = "django_pgjobs"
    enqueue_api = "noop.enqueue_many([()] * n) (COPY, 5,000 rows per batch, one transaction)"
    enqueue_one_api = "noop.enqueue(ts) in autocommit (one INSERT ... RETURNING + NOTIFY)"

    def __init__(self, db: str):
        super().__init__(db)
        os.environ["BENCH_DB"] = db
        os.environ["DJANGO_SETTINGS_MODULE"] = "dj_pgjobs.settings"
        import django

        django.setup()
        from dj_pgjobs.jobs import noop

        self.noop = noop

    def version(self) -> str:
        import django_pgjobs

        return f"{django_pgjobs.__version__} (Django {_pkg_version('django')})"

    def settings(self) -> dict:
        return {
            "worker": "manage.py runjobs (own command)",
            "processes": WORKERS,
            "concurrency": CONCURRENCY or "default",
            "batch": BATCH or "default",
            "queues": QUEUES or "* (default)",
            "listen_notify": LISTEN,
            "poll_interval_s": POLL,
            "extra_args": EXTRA,
            "conn_max_age": None,
            "database_options": "server_side_binding=True, prepare_threshold=5"
            if os.environ.get("BENCH_PGJOBS_PREPARE", "0") == "1"
            else "Django defaults",
            "task": "sync def no-op (@job)",
            "driver": f"psycopg {_pkg_version('psycopg')}",
        }

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def close(self) -> None:
        from django.db import connections

        connections.close_all()

    def enqueue_bulk(self, n: int) -> None:
        self.noop.enqueue_many([()] * n)

    def enqueue_one(self, ts: float | None) -> None:
        self.noop.enqueue(ts)

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_PGJOBS_LISTEN": "1" if LISTEN else "0", "BENCH_PGJOBS_POLL": str(POLL)}

    def worker_commands(self) -> list[list[str]]:
        argv = [
            sys.executable,
            "-m",
            "django",
            "runjobs",
            "--settings=dj_pgjobs.settings",
            "--verbosity=0",
        ]
        if QUEUES:
            argv.append(f"--queues={QUEUES}")
        if CONCURRENCY:
            argv.append(f"--concurrency={CONCURRENCY}")
        if BATCH:
            argv.append(f"--batch={BATCH}")
        argv += EXTRA
        if not LISTEN:
            argv.append("--no-listen")
        return [list(argv) for _ in range(WORKERS)]

    def io_plan(self, kind: str) -> benchlib.IoPlan:
        from django_pgjobs.worker import DEFAULT_ASYNC_CONCURRENCY, DEFAULT_CONCURRENCY

        argv = [
            sys.executable,
            "-m",
            "django",
            "runjobs",
            "--settings=dj_pgjobs.settings",
            "--verbosity=0",
        ]
        per_process = DEFAULT_CONCURRENCY if kind == "sync" else DEFAULT_ASYNC_CONCURRENCY
        basis = (
            "runjobs --concurrency default (threads)"
            if kind == "sync"
            else "runjobs --async-concurrency default (one event loop)"
        )
        # Only for choosing the defaults (bench/sweep.sh), never in the side-by-side run:
        if CONCURRENCY:
            flag = "--concurrency" if kind == "sync" else "--async-concurrency"
            argv.append(f"{flag}={CONCURRENCY}")
            per_process, basis = int(CONCURRENCY), f"{flag} {CONCURRENCY} (sweep)"
        if BATCH:
            argv.append(f"--batch={BATCH}")
        return benchlib.IoPlan(
            worker_commands=[list(argv) for _ in range(WORKERS)],
            per_process_concurrency=per_process,
            concurrency_basis=basis,
            settings={
                "worker": "plain manage.py runjobs (no flags)",
                "task": f"@job {'def' if kind == 'sync' else 'async def'} io_{kind}",
                "database_options": "Django defaults",
            },
        )

    def enqueue_io(self, n: int, kind: str) -> None:
        from dj_pgjobs.jobs import io_async, io_sync

        (io_sync if kind == "sync" else io_async).enqueue_many([()] * n)

    def count_done(self, cur) -> int:
        cur.execute("SELECT count(*) FROM django_pgjobs_job WHERE status = 'completed'")
        return cur.fetchone()[0]

    def finish_window(self, cur):
        cur.execute(
            "SELECT extract(epoch FROM min(finished_at))::float8,"
            " extract(epoch FROM max(finished_at))::float8"
            " FROM django_pgjobs_job WHERE status = 'completed'"
        )
        return cur.fetchone()

    def count_queued(self, cur) -> int:
        cur.execute("SELECT count(*) FROM django_pgjobs_job")
        return cur.fetchone()[0]


if __name__ == "__main__":
    benchlib.main(Adapter)
