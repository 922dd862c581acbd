"""emit_event: stored in the caller's transaction, bad input refused before any row,
events pruned after EVENT_RETENTION (docs/reference/api.md)."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from django_pgjobs import emit_event
from django_pgjobs.checks import check_settings
from django_pgjobs.maintenance.pg_cron_engine import PRUNE_ENTRY, maintenance_entries
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.models import JobEvent
from tests.conftest import dsn

pytestmark = pytest.mark.django_db


def test_an_event_is_stored_with_its_name_key_and_payload() -> None:
    event_id = emit_event("invoice.paid", key="42", payload={"amount": 10})
    event = JobEvent.objects.get(id=event_id)
    assert (event.name, event.key, event.payload) == ("invoice.paid", "42", {"amount": 10})
    no_key = JobEvent.objects.get(id=emit_event("deploy.done"))
    assert (no_key.key, no_key.payload) == (None, None)


def test_an_event_commits_and_rolls_back_with_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        emit_event("invoice.paid", key="42")
        raise RuntimeError("the webhook's own write failed")
    assert not JobEvent.objects.exists()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": ""}, ValueError, "event name must be a non-empty string"),
        ({"name": None}, ValueError, "event name must be a non-empty string"),
        ({"name": "a", "key": 42}, ValueError, "key must be a non-empty string"),
        ({"name": "a", "key": ""}, ValueError, "key must be a non-empty string"),
        ({"name": "a", "payload": {"t": timezone.now()}}, TypeError, "isoformat"),
        ({"name": "a", "payload": "\ud800"}, TypeError, "lone surrogate"),
    ],
)
def test_bad_input_names_the_argument_and_writes_nothing(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        emit_event(**kwargs)
    assert not JobEvent.objects.exists()


def test_a_payload_larger_than_max_args_bytes_is_refused(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "MAX_ARGS_BYTES": 50}
    with pytest.raises(ValueError, match=r"the event payload is 104 bytes .*MAX_ARGS_BYTES"):
        emit_event("a", payload=["x" * 100])
    assert not JobEvent.objects.exists()


def test_events_are_pruned_after_their_retention(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "EVENT_RETENTION": 3600, "EVENT_LOOKBACK": 60}
    old, recent = emit_event("a", key="1"), emit_event("a", key="2")
    JobEvent.objects.filter(id=old).update(created_at=timezone.now() - timedelta(hours=2))
    out = io.StringIO()
    call_command("prune_jobs", "--dry-run", stdout=out)
    assert "would delete 1 event(s) older than 3600s" in out.getvalue()
    assert Pruner(batch=1).run_once()["events"] == 1
    assert list(JobEvent.objects.values_list("id", flat=True)) == [recent]


def test_a_retention_shorter_than_the_lookback_is_refused(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, "EVENT_RETENTION": 60, "EVENT_LOOKBACK": 3600}
    [error] = [m for m in check_settings() if m.id == "django_pgjobs.E012"]
    assert "EVENT_RETENTION'] (60s) is shorter than EVENT_LOOKBACK (3600s)" in error.msg


@pytest.mark.django_db(transaction=True)
def test_the_pg_cron_engines_prune_deletes_old_events_too() -> None:
    """With CRON_ENGINE = "pg_cron" no worker prunes: the prune entry's SQL (run here
    as pg_cron would run it) deletes the events past their retention."""
    old, recent = emit_event("a", key="1"), emit_event("a", key="2")
    JobEvent.objects.filter(id=old).update(created_at=timezone.now() - timedelta(days=8))
    with psycopg.connect(dsn(), autocommit=True) as conn:
        [prune] = [e for e in maintenance_entries(conn) if e.jobname == PRUNE_ENTRY]
        conn.execute(prune.command)
    assert list(JobEvent.objects.values_list("id", flat=True)) == [recent]
