"""Control characters in names taken from rows never reach a terminal or split a
log line: ``jobs_status`` and every log record escape them."""

from __future__ import annotations

import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from django_pgjobs.models import Job
from django_pgjobs.support.safetext import printable
from django_pgjobs.testing import run_jobs
from tests.testapp.jobs import add

pytestmark = pytest.mark.django_db

HOSTILE_QUEUE = "esc\x1b[31mRED"
HOSTILE_TASK = "app.jobs.x\n2026-01-01 ERROR forged line\x1b[2J\u202e"


def _unprintable(text: str) -> list[str]:
    return sorted({c for c in text if not c.isprintable() and c != "\n"})


def test_printable_escapes_like_repr() -> None:
    assert printable("plain text, é ü 字") == "plain text, é ü 字"
    assert printable("a\x1b[31mb\nc\td\u202e") == "a\\x1b[31mb\\nc\\td\\u202e"


def test_jobs_status_escapes_queue_names() -> None:
    add.using(queue=HOSTILE_QUEUE).enqueue(1, 2)
    out = StringIO()
    call_command("jobs_status", stdout=out)
    text = out.getvalue()
    assert "\x1b" not in text and _unprintable(text) == []
    assert "esc\\x1b[31mRED" in text


def test_log_lines_about_hostile_rows_stay_one_escaped_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgjobs_enqueue(%s, queue => %s, run_at => now())", [HOSTILE_TASK, HOSTILE_QUEUE]
        )
    with caplog.at_level(logging.INFO, logger="django_pgjobs"):
        ran = run_jobs()
    # An unknown task is left pending (as a worker does); run_jobs says so in one line.
    assert ran == [], list(Job.objects.values_list("task", "queue", "status"))
    messages = [r.getMessage() for r in caplog.records if r.name == "django_pgjobs"]
    assert any("forged line" in m for m in messages), messages
    for message in messages:
        assert "\n" not in message and _unprintable(message) == [], message
    assert any("app.jobs.x\\n2026-01-01 ERROR forged line\\x1b[2J\\u202e" in m for m in messages)
