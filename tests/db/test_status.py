"""``manage.py jobs_status`` and ``django_pgjobs.health.status``: counts, lag, stuck, workers, health."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from django_pgjobs.health import status

pytestmark = pytest.mark.django_db(transaction=True)


def run(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)


@pytest.fixture
def jobs() -> None:
    run("""
        INSERT INTO django_pgjobs_job (task, queue, status, run_at)
        SELECT 't', 'a', 'pending', now() - interval '120 seconds' FROM generate_series(1, 3);
        INSERT INTO django_pgjobs_job (task, queue, status, run_at)
        VALUES ('t', 'a', 'pending', now() + interval '1 hour');
        INSERT INTO django_pgjobs_job (task, queue, status, attempts, heartbeat_at, started_at)
        VALUES ('t', 'b', 'running', 1, now() - interval '1 hour', now() - interval '1 hour'),
               ('t', 'b', 'running', 1, now(), now());
        INSERT INTO django_pgjobs_job (task, queue, status, finished_at)
        SELECT 't', 'a', 'completed', now() - interval '5 minutes' FROM generate_series(1, 4);
        INSERT INTO django_pgjobs_job (task, queue, status, finished_at)
        SELECT 't', 'a', 'completed', now() - interval '2 days' FROM generate_series(1, 50);
        INSERT INTO django_pgjobs_job (task, queue, status, finished_at)
        VALUES ('t', 'c', 'dead', now() - interval '1 minute');
        INSERT INTO django_pgjobs_worker (id, host, pid, queues, concurrency)
        VALUES ('h:1', 'h', 1, '["a"]', 4), ('h:2', 'h', 2, '["*"]', 4);
        INSERT INTO django_pgjobs_worker (id, host, pid, queues, concurrency, last_seen)
        VALUES ('gone:3', 'gone', 3, '["b"]', 4, now() - interval '1 hour');
        ANALYZE django_pgjobs_job;
    """)


def statistics() -> str:
    """What the estimates were made from, for a failure's message: once, on the
    embedded server (autovacuum on), the completed estimate read 88 for 54 rows."""
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT c.reltuples, c.relpages, s.n_live_tup, s.n_dead_tup, s.n_mod_since_analyze,
                   s.last_analyze, s.last_autoanalyze, s.last_autovacuum,
                   (SELECT most_common_vals::text || ' ' || most_common_freqs::text
                      FROM pg_stats WHERE tablename = c.relname AND attname = 'status')
              FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
             WHERE c.oid = 'django_pgjobs_job'::regclass""")
        return repr(cursor.fetchone())


@pytest.fixture
def stats_held() -> Iterator[None]:
    """No autovacuum or autoanalyze of the jobs table between the ANALYZE and the read:
    one that ran in between (the embedded server has autovacuum on) rewrote the
    estimate the test reads (once: 88 completed for 54 rows). Switching it off for
    the table waits for (or cancels) one that is running; the ANALYZE then comes last."""
    run("ALTER TABLE django_pgjobs_job SET (autovacuum_enabled = false)")
    try:
        run("ANALYZE django_pgjobs_job")
        yield
    finally:
        run("ALTER TABLE django_pgjobs_job RESET (autovacuum_enabled)")


def test_collect_counts_live_work_exactly_and_history_by_window(
    jobs: None, stats_held: None
) -> None:
    result = status.collect(window=3600)
    by_queue = {q.queue: q for q in result.queues}
    a, b, c = by_queue["a"], by_queue["b"], by_queue["c"]
    assert (a.pending, a.due, a.running, a.stuck, a.workers) == (4, 3, 0, 0, 2)
    assert 119 <= (a.lag or 0) < 200
    assert (b.pending, b.running, b.stuck, b.lag, b.workers) == (0, 2, 1, None, 1)
    assert a.finished == {"cancelled": 0, "completed": 4, "dead": 0}  # not the 2-day-old 50
    assert c.finished["dead"] == 1
    assert [w["id"] for w in result.workers] == ["h:1", "h:2"]
    # Totals over all history are planner estimates (ANALYZE ran), close to the truth.
    assert result.estimated_totals["completed"] == pytest.approx(54, abs=3), statistics()
    jobs_table = result.tables[0]
    assert jobs_table.table == "django_pgjobs_job"
    assert jobs_table.storage_parameters["autovacuum_vacuum_scale_factor"] == "0.05"
    assert any("queue 'b': 1 running job(s) with a stale heartbeat" in w for w in result.warnings)


def test_plain_table_output(jobs: None, capsys: Any) -> None:
    call_command("jobs_status")
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == [
        "queue",
        "pending",
        "blocked",
        "waiting",
        "due",
        "running",
        "stuck",
        "lag",
        "workers",
        "cancelled/1h",
        "completed/1h",
        "dead/1h",
    ]
    row_a = next(line.split() for line in out.splitlines() if line.startswith("a "))
    assert row_a[:6] == ["a", "4", "0", "0", "3", "0"] and row_a[8:] == ["2", "0", "4", "0"]
    assert "autovacuum_vacuum_scale_factor=0.05" in out
    assert "live workers: 2" in out and "WARNING: queue 'b'" in out


def test_json_output_for_machines(jobs: None, capsys: Any) -> None:
    call_command("jobs_status", "--json", "--window", "3d")
    data = json.loads(capsys.readouterr().out)
    a = next(q for q in data["queues"] if q["queue"] == "a")
    assert a["finished"]["completed"] == 54 and data["window"] == 3 * 86400
    assert {t["table"] for t in data["tables"]} == {"django_pgjobs_job", "django_pgjobs_jobresult"}
    assert isinstance(data["tables"][0]["live_tuples"], int)


def test_empty_database(capsys: Any) -> None:
    call_command("jobs_status")
    assert "(no jobs)" in capsys.readouterr().out


def test_warns_when_dead_tuples_dominate_or_parameters_are_missing() -> None:
    base = status.collect()
    table = base.tables[0]
    bloated = replace(
        table, live_tuples=1000, dead_tuples=9000, dead_share=0.9, storage_parameters={}
    )
    texts = " ".join(status.warnings(replace(base, tables=[bloated, base.tables[1]])))
    assert "dead tuples dominate django_pgjobs_job: 9000 dead vs 1000 live" in texts
    assert "lacks the autovacuum storage parameters" in texts
    healthy = replace(
        table, live_tuples=9000, dead_tuples=1000, dead_share=0.1, autovacuum_enabled=True
    )
    assert status.warnings(replace(base, tables=[healthy, base.tables[1]])) == []


def test_due_work_without_a_worker_warns() -> None:
    run("INSERT INTO django_pgjobs_job (task, queue) VALUES ('t', 'orphan')")
    assert any("no live worker serves this queue" in w for w in status.collect().warnings)


def test_warns_when_autovacuum_is_off_for_the_jobs_table() -> None:
    def autovacuum_warnings() -> list[str]:
        return [w for w in status.warnings(status.collect()) if "autovacuum is off" in w]

    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        server_on = cursor.fetchone()[0] == "on"
    assert bool(autovacuum_warnings()) is not server_on
    run("ALTER TABLE django_pgjobs_job SET (autovacuum_enabled = false)")
    try:
        assert len(autovacuum_warnings()) == 1
        assert status.collect().tables[0].autovacuum_enabled is False
    finally:
        run("ALTER TABLE django_pgjobs_job RESET (autovacuum_enabled)")
