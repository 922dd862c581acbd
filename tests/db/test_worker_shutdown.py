"""How an in-process ``Worker`` ends: every thread joined before its row is deleted,
and an exit code that says whether jobs were left to the reaper."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from django_pgjobs.models import Job
from django_pgjobs.models import Worker as WorkerRow
from django_pgjobs.worker.loop import Worker
from tests.conftest import dsn, run_burst_worker, wait_until
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting(conn: psycopg.Connection, statement: str) -> bool:
    """Whether a backend is waiting on a lock while running ``statement…``."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND pid <> pg_backend_pid() AND datname = current_database() AND query LIKE %s",
        ["%" + statement + "%"],
    ).fetchone()
    return bool(row and row[0])


def test_a_heartbeat_in_flight_at_stop_cannot_bring_the_worker_row_back(
    other_connection: psycopg.Connection,
) -> None:
    """The heartbeat is held inside its Worker-row upsert (the test deletes the row in
    an open transaction) when the worker is told to stop. The worker must wait for
    that heartbeat before deleting its row; a worker that deleted first would see
    the heartbeat re-insert the row once the transaction commits."""
    worker = Worker(maintenance=False, poll_interval=0.1)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: WorkerRow.objects.filter(id=worker.id).exists(), message="worker row")
        with other_connection.transaction():
            other_connection.execute("DELETE FROM django_pgjobs_worker WHERE id = %s", [worker.id])
            with psycopg.connect(dsn(), autocommit=True) as watcher:
                wait_until(
                    lambda: _waiting(watcher, "INSERT INTO django_pgjobs_worker"),
                    message="the heartbeat to wait inside its upsert",
                )
                worker.request_stop()
                # A worker that does not join its heartbeat deletes its row now (the
                # DELETE waits on the same transaction). Give it the chance.
                # it waits for its heartbeat first: what this test wants
                with contextlib.suppress(AssertionError):
                    wait_until(
                        lambda: _waiting(watcher, "DELETE FROM django_pgjobs_worker"),
                        timeout=3,
                        message="the worker's DELETE",
                    )
        thread.join(30)
        assert not thread.is_alive(), "worker did not stop"
        wait_until(
            lambda: (
                not any(
                    t.name == "pgjobs-heartbeat" and t.is_alive() for t in threading.enumerate()
                )
            ),
            message="the heartbeat thread to end",
        )
        assert not WorkerRow.objects.filter(id=worker.id).exists(), (
            "the Worker row came back after the worker stopped"
        )
        assert codes == [0]
    finally:
        worker.request_stop()
        thread.join(30)


@pytest.fixture
def refuse_outcomes(other_connection: psycopg.Connection) -> Iterator[Callable[[int], None]]:
    """``refuse(job_id)``: a real trigger then refuses to finish that job (completed or
    dead), so the worker can write neither its outcome nor the dead-letter fallback."""
    other_connection.execute("CREATE TABLE pgjobs_test_refused (id bigint PRIMARY KEY)")
    other_connection.execute(
        """
        CREATE FUNCTION pgjobs_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status IN ('completed', 'dead')
               AND EXISTS (SELECT 1 FROM pgjobs_test_refused r WHERE r.id = NEW.id) THEN
                RAISE EXCEPTION 'refused by the test';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    other_connection.execute(
        "CREATE TRIGGER pgjobs_test_refuse BEFORE UPDATE ON django_pgjobs_job "
        "FOR EACH ROW EXECUTE FUNCTION pgjobs_test_refuse()"
    )

    def refuse(job_id: int) -> None:
        other_connection.execute("INSERT INTO pgjobs_test_refused VALUES (%s)", [job_id])

    try:
        yield refuse
    finally:
        other_connection.execute("DROP TRIGGER pgjobs_test_refuse ON django_pgjobs_job")
        other_connection.execute("DROP FUNCTION pgjobs_test_refuse()")
        other_connection.execute("DROP TABLE pgjobs_test_refused")


def _run_burst() -> tuple[Worker, int]:
    worker = Worker(burst=True, maintenance=False, listen=False)
    return worker, run_burst_worker(worker)


def test_exit_code_is_0_when_every_outcome_was_written() -> None:
    done = jobs.add.enqueue(1, 2)
    worker, code = _run_burst()
    assert code == 0 and worker.unwritten == 0
    done.refresh_from_db()
    assert done.status == "completed"


def test_exit_code_is_1_when_an_outcome_is_left_to_the_reaper(
    refuse_outcomes: Callable[[int], None], caplog: Any
) -> None:
    fine = jobs.add.enqueue(1, 2)
    stuck = jobs.add.enqueue(3, 4)
    refuse_outcomes(stuck.id)
    with caplog.at_level("ERROR", logger="django_pgjobs"):
        worker, code = _run_burst()
    assert code == 1 and worker.unwritten == 1
    fine.refresh_from_db()
    stuck.refresh_from_db()
    assert fine.status == "completed"
    assert stuck.status == "running", "left running, for the reaper to reclaim"
    assert any("1 job(s) could not be written back" in r.getMessage() for r in caplog.records)


def test_job_result_reads_the_configured_database_alias(settings: Any) -> None:
    """``Job.result`` of a row not loaded from a database (``_state.db`` unset) reads
    ``PGJOBS["DATABASE"]``, not the ``default`` alias."""
    from django.db.utils import ConnectionDoesNotExist

    job = jobs.add.enqueue(2, 3)
    _run_burst()
    assert Job.objects.get(id=job.id).result == 5
    assert Job(id=job.id).result == 5  # PGJOBS["DATABASE"] is "default" here
    settings.PGJOBS = {**settings.PGJOBS, "DATABASE": "pgjobs-elsewhere"}
    with pytest.raises(ConnectionDoesNotExist, match="pgjobs-elsewhere"):
        Job(id=job.id).result  # noqa: B018 - the property reads the database


def test_runjobs_exits_1_when_a_job_is_left_to_the_reaper(
    refuse_outcomes: Callable[[int], None], start_worker: Callable[..., Any]
) -> None:
    """The operator's view: ``runjobs --burst`` exits 1 (and says why) when an outcome
    could not be written; 0 when everything was."""
    jobs.add.enqueue(1, 2)
    ok = start_worker("--burst", "--no-maintenance")
    assert ok.wait() == 0, ok.output()
    stuck = jobs.add.enqueue(3, 4)
    refuse_outcomes(stuck.id)
    failed = start_worker("--burst", "--no-maintenance")
    assert failed.wait() == 1, failed.output()
    assert "1 job(s) could not be written back" in failed.output()
    stuck.refresh_from_db()
    assert stuck.status == "running"
