"""Admin pages and ``jobs_status`` on a busy table: pages whose cost does not grow with
throughput.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pgjobs_pages \\
        python bench/admin_pages.py setup     # create the database, migrate, 1,000,000 rows
    DATABASE_URL=... python bench/admin_pages.py measure [--repeat 5]

``setup`` writes, with ``generate_series`` in a few statements (tasks of the test
app, so that the search knows them): 890,000 jobs completed
and 10,000 dead-lettered, their finishes spread over the last hour (about 250 jobs/s),
99,000 pending and 1,000 running with a stale heartbeat (stuck), over four queues; then
``VACUUM ANALYZE``. It then runs the rollup until it has caught up, as the workers'
maintenance loop does (``--no-rollup`` skips that: the "before" state).

``attach`` readies a database that already holds jobs (a running ``bench/run
--long-soak``'s, to time the pages on the soak's data while it runs): it migrates the
test project's other apps and adds the ``bench`` user, and writes no jobs.

``measure --without-rollup`` empties the rollup first, so the pages count every
finished job as they did before it (``rollup`` fills it again): both in one sitting.

``measure`` times each page with Django's test client, in this process: the median of
``--repeat`` loads after one warm-up load, the median CPU time of this process per load
(Django and the page's Python: on a shared box it moves far less than the wall clock,
which includes waiting for a core), and the number of queries each load makes (all of
them, and those on the jobs table).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

ROWS_SQL = """
INSERT INTO django_pgjobs_job
    (task, queue, status, run_at, created_at, started_at, finished_at, heartbeat_at,
     attempts, lease, worker, args, last_error)
SELECT 'tests.testapp.jobs.' || (ARRAY['noop', 'add', 'send_email', 'always_fails'])[1 + g %% 4],
       (ARRAY['default', 'emails', 'reports', 'other'])[1 + (g / 7) %% 4],
       %(status)s,
       f - interval '2 seconds', f - interval '3 seconds',
       f - interval '1 second', f, f - interval '1 second',
       1, 1, 'bench-worker', jsonb_build_array(g), %(error)s
  FROM (SELECT g, now() - interval '1 hour' + (interval '1 hour' * g / %(n)s) AS f
          FROM generate_series(1, %(n)s) AS g) AS s
"""

PENDING_SQL = """
INSERT INTO django_pgjobs_job (task, queue, status, run_at, args)
SELECT 'tests.testapp.jobs.' || (ARRAY['noop', 'add', 'send_email', 'always_fails'])[1 + g %% 4],
       (ARRAY['default', 'emails', 'reports', 'other'])[1 + (g / 7) %% 4],
       'pending', now() - interval '5 minutes' + interval '1 millisecond' * g,
       jsonb_build_array(g)
  FROM generate_series(1, %(n)s) AS g
"""

STUCK_SQL = """
INSERT INTO django_pgjobs_job
    (task, queue, status, run_at, started_at, heartbeat_at, attempts, lease, worker, args)
SELECT 'tests.testapp.jobs.add', 'reports', 'running', now() - interval '20 minutes',
       now() - interval '15 minutes', now() - interval '10 minutes', 1, 1, 'gone-worker',
       jsonb_build_array(g)
  FROM generate_series(1, %(n)s) AS g
"""


def _admin_database_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres")), parts.path.lstrip("/")


def setup(rollup: bool) -> None:
    import psycopg

    admin_url, name = _admin_database_url(os.environ["DATABASE_URL"])
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(ROWS_SQL, {"status": "completed", "n": 890_000, "error": None})
        cursor.execute(ROWS_SQL, {"status": "dead", "n": 10_000, "error": "boom"})
        cursor.execute(PENDING_SQL, {"n": 99_000})
        cursor.execute(STUCK_SQL, {"n": 1_000})
    connection.close()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE django_pgjobs_job")
    print(f"1,000,000 rows written and analyzed in {time.monotonic() - started:.1f} s")
    if rollup:
        catch_up()


def attach() -> None:
    """Ready a database that already holds jobs for ``measure``: no rows written."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    if not users.filter(username="bench").exists():
        users.create_superuser("bench", "bench@example.com", "bench")


def catch_up() -> None:
    """Run rollup passes until the rollup has reached the present (as the workers do)."""
    import django

    django.setup()
    from django_pgjobs.maintenance.rollup import Rollup

    started = time.monotonic()
    passes = 0
    while True:
        passes += 1
        if Rollup(time_budget=None).run_once()["caught_up"]:
            break
    print(f"rollup caught up in {passes} pass(es), {time.monotonic() - started:.1f} s")


PAGES = (
    ("overview", "/admin/django_pgjobs/job/overview/"),
    ("changelist", "/admin/django_pgjobs/job/"),
    ("status=dead", "/admin/django_pgjobs/job/?status=dead"),
    ("attention=dead", "/admin/django_pgjobs/job/?attention=dead"),
    ("attention=stuck", "/admin/django_pgjobs/job/?attention=stuck"),
    ("attention=due", "/admin/django_pgjobs/job/?attention=due"),
    ("status=pending", "/admin/django_pgjobs/job/?status__exact=pending"),
    ("queue=emails", "/admin/django_pgjobs/job/?queue=emails"),
    ("task filter, no rows", "/admin/django_pgjobs/job/?task=tests.testapp.jobs.discard_me"),
    ("search q=noop", "/admin/django_pgjobs/job/?q=noop"),
    ("search, a task (1 in 4 rows)", "/admin/django_pgjobs/job/?q=tests.testapp.jobs.send_email"),
    ("search, a task with no rows", "/admin/django_pgjobs/job/?q=tests.testapp.jobs.discard_me"),
    ("job page", "/admin/django_pgjobs/job/{job}/change/"),
)


def measure(repeat: int, *, without_rollup: bool = False, task: str | None = None) -> None:
    import django

    django.setup()
    if without_rollup:  # the pages then count every finished job, as before the rollup
        from django.db import connection as conn

        with conn.cursor() as cursor:
            cursor.execute("TRUNCATE django_pgjobs_minute, django_pgjobs_rollupmark")
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    with connection.cursor() as cursor:
        # a dead job's page (it carries an error); on a soak's data, the newest job's
        cursor.execute(
            "SELECT coalesce((SELECT max(id) FROM django_pgjobs_job WHERE status = 'dead'),"
            " (SELECT max(id) FROM django_pgjobs_job))"
        )
        job = cursor.fetchone()[0]
        cursor.execute("SELECT status, count(*) FROM django_pgjobs_job GROUP BY 1 ORDER BY 1")
        rows = ", ".join(f"{n:,} {status}" for status, n in cursor.fetchall())

    def timed(run):  # type: ignore[no-untyped-def]
        run()  # warm-up
        times, cpu = [], []
        for _ in range(repeat):
            with CaptureQueriesContext(connection) as queries:
                started, started_cpu = time.perf_counter(), time.process_time()
                run()
                times.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - started_cpu) * 1000)
        on_jobs = sum("django_pgjobs_job" in q["sql"] for q in queries.captured_queries)
        return (
            f"{statistics.median(times):10.1f} {statistics.median(cpu):7.1f}",
            len(queries.captured_queries),
            on_jobs,
        )

    print(f"load average {os.getloadavg()[0]:.1f}; jobs: {rows}")
    print(f"{'page':28} {'median ms':>10} {'cpu ms':>7} {'queries':>8} {'on jobs':>8}")
    pages = PAGES
    if task:  # a task the data holds (a soak's): its filter and its search
        pages += (
            ("task filter, --task", f"/admin/django_pgjobs/job/?task={task}"),
            ("search, --task", f"/admin/django_pgjobs/job/?q={task}"),
        )
    for label, url in pages:

        def load(url: str = url.format(job=job)) -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        ms, n, on_jobs = timed(load)
        print(f"{label:28} {ms} {n:8d} {on_jobs:8d}")

    def status() -> None:
        with open(os.devnull, "w") as out:
            call_command("jobs_status", stdout=out)

    ms, n, on_jobs = timed(status)
    print(f"{'jobs_status':28} {ms} {n:8d} {on_jobs:8d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("setup", "attach", "measure", "rollup"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-rollup", action="store_true", help="setup: leave the rollup empty")
    parser.add_argument(
        "--without-rollup",
        action="store_true",
        help="measure: empty the rollup first (the pages read every job; `rollup` refills it)",
    )
    parser.add_argument("--task", help="measure: also filter and search on this task's name")
    args = parser.parse_args()
    if args.command == "setup":
        setup(rollup=not args.no_rollup)
    elif args.command == "attach":
        attach()
    elif args.command == "rollup":
        catch_up()
    else:
        measure(args.repeat, without_rollup=args.without_rollup, task=args.task)


if __name__ == "__main__":
    main()
