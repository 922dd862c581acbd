"""Values entering the queue: size bounds, the database
clock for delays, naive datetimes with USE_TZ = False, hostile shapes refused."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_pgjobs.models import Job
from django_pgjobs.support.validation import MAX_DEPTH
from tests.testapp.jobs import add, send_email

pytestmark = pytest.mark.django_db

SMALL = {"MAX_ARGS_BYTES": 1000}


@pytest.fixture
def small_args(settings: Any) -> None:
    settings.PGJOBS = {**settings.PGJOBS, **SMALL}


@pytest.mark.parametrize(
    "enqueue",
    [
        lambda: send_email.enqueue("x" * 2000),
        lambda: send_email.using(priority=1).enqueue("a", subject="y" * 2000),
        lambda: Job.objects.enqueue("tests.testapp.jobs.send_email", args=["x" * 2000]),
        lambda: send_email.enqueue_many([("a",), ("x" * 2000,)]),
    ],
    ids=["enqueue", "kwarg", "by-name", "enqueue_many"],
)
def test_arguments_over_max_args_bytes_are_refused_naming_the_argument(
    small_args: None, enqueue: Any
) -> None:
    with pytest.raises(
        ValueError, match=r"argument '(to|subject)' is 2,00\d bytes.*MAX_ARGS_BYTES"
    ):
        enqueue()
    assert Job.objects.count() == 0


def test_arguments_at_the_limit_are_accepted(small_args: None) -> None:
    job = send_email.enqueue("x" * 900)
    assert Job.objects.get(pk=job.pk).args == ["x" * 900]


@pytest.mark.parametrize(
    "setup, args, message",
    [
        (
            "SET LOCAL pgjobs.max_args_bytes = '1000'",
            f'["{"x" * 2000}"]',
            "args and kwargs are 20.. bytes as JSON, more than pgjobs.max_args_bytes",
        ),
        ("", f'["{"x" * 1_100_000}"]', "more than pgjobs.max_args_bytes .1048576."),
        ("", "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2), f"more than {MAX_DEPTH} levels deep"),
        ("", "[1e5000]", "a number of more than 4200 digits"),
    ],
    ids=["setting", "default", "depth", "huge-number"],
)
def test_pgjobs_enqueue_refuses_what_python_would(setup: str, args: str, message: str) -> None:
    with connection.cursor() as cursor:
        if setup:
            cursor.execute(setup)
        with pytest.raises(DatabaseError, match=message), transaction.atomic():
            cursor.execute("SELECT pgjobs_enqueue('tests.testapp.jobs.add', %s::jsonb)", [args])
    assert Job.objects.count() == 0


def test_pgjobs_enqueue_accepts_the_deepest_python_accepts() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH):
        deep = [deep]
    add.enqueue(deep, 1)  # Python's bound
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgjobs_enqueue('tests.testapp.jobs.add', %s::jsonb)", [json.dumps([deep, 1])]
        )
    assert Job.objects.count() == 2


def test_an_int_too_long_to_read_back_is_refused() -> None:
    with pytest.raises(
        TypeError, match="argument 'a' cannot be stored as JSON: an int of about 5000 digits"
    ):
        add.enqueue(10**5000, 1)
    assert Job.objects.count() == 0


def test_deep_nesting_is_refused() -> None:
    deep: Any = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(
        TypeError,
        match=f"argument 'a'.* nested too deeply: lists/dicts more than {MAX_DEPTH} levels",
    ):
        add.enqueue(deep, 1)
    deeper: Any = []
    for _ in range(5000):  # far past Python's recursion limit: still a clear TypeError
        deeper = [deeper]
    with pytest.raises(TypeError, match="nested too deeply"):
        add.enqueue(deeper, 1)
    assert Job.objects.count() == 0


def _db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]  # type: ignore[no-any-return]


def test_delay_uses_the_database_clock() -> None:
    # Inside the test transaction now() stands still: run_at is exactly now() + delay.
    now = _db_now()
    job = add.using(delay=timedelta(seconds=60)).enqueue(1, 2)
    assert job.run_at == now + timedelta(seconds=60)
    assert Job.objects.get(pk=job.pk).run_at == job.run_at
    job = Job.objects.enqueue("tests.testapp.jobs.add", args=[1, 2], delay=1.5)
    assert job.run_at == now + timedelta(seconds=1.5)
    add.using(delay=30).enqueue_many([(5, 6), (7, 8)])
    rows = list(Job.objects.filter(args__in=[[5, 6], [7, 8]]))
    assert len(rows) == 2 and all(r.run_at == now + timedelta(seconds=30) for r in rows)


@override_settings(USE_TZ=False)
def test_naive_datetimes_agree_between_enqueue_and_the_orm() -> None:
    job = add.using(delay=60).enqueue(1, 2)
    fresh = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(fresh, field.attname), field.attname
    assert timezone.is_naive(job.run_at) and timezone.is_naive(job.created_at)
    assert job.created_at <= timezone.now() < job.run_at
    again = add.using(idempotency_key="naive-key").enqueue(1, 2)
    existing = add.using(idempotency_key="naive-key").enqueue(1, 2)  # read back by key
    assert existing.pk == again.pk and existing.created_at == again.created_at
    assert timezone.is_naive(existing.created_at)


@override_settings(USE_TZ=False)
def test_naive_run_at_is_accepted_without_use_tz() -> None:
    when = datetime.now() + timedelta(hours=1)
    job = add.using(run_at=when).enqueue(1, 2)
    assert Job.objects.get(pk=job.pk).run_at == job.run_at == when


NON_ASCII = [
    ["é" * 400_000],  # 800 KB of UTF-8; 2.4 MB as \u00e9 escapes
    ["日本語のテキスト" * 10, {"clé": "valeur", "emoji": "🎉" * 5}],
    [{"nested": [["ü", 1, 2.5, None, True]], 'quote"and\\back': "tab\tnew\nline"}],
    ["plain ascii", 12345, -7],
]


@pytest.mark.parametrize("args", NON_ASCII, ids=["e-acute", "cjk-emoji", "escapes", "ascii"])
def test_python_and_sql_count_the_same_bytes(settings: Any, args: list[Any]) -> None:
    """One byte count: the UTF-8 of the JSON text as PostgreSQL prints the stored
    value. At exactly that limit both accept; one byte under, both refuse."""
    from django_pgjobs.support.validation import json_bytes, json_text

    python_size = json_bytes(json_text(args)) + json_bytes(json_text({}))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT octet_length(%s::jsonb::text) + octet_length('{}'::jsonb::text)",
            [json_text(args)],
        )
        assert cursor.fetchone()[0] == python_size
    if args == NON_ASCII[0]:
        assert python_size == 800_006  # not the 2.4 MB of its ASCII-escaped text

    def sql_enqueue(limit: int) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL pgjobs.max_args_bytes = '{limit}'")
            cursor.execute(
                "SELECT pgjobs_enqueue('tests.testapp.jobs.echo_value', %s::jsonb, '{}'::jsonb)",
                [json_text(args)],
            )

    from tests.testapp.jobs import echo_value

    for limit, accepted in ((python_size, True), (python_size - 1, False)):
        settings.PGJOBS = {**settings.PGJOBS, "MAX_ARGS_BYTES": limit}
        if accepted:
            echo_value.enqueue(*args)
            sql_enqueue(limit)
        else:
            with pytest.raises(ValueError, match=f"all arguments: {python_size:,} bytes"):
                echo_value.enqueue(*args)
            with pytest.raises(DatabaseError, match=f"args and kwargs are {python_size} bytes"):
                sql_enqueue(limit)
    stored = list(Job.objects.values_list("args", flat=True))
    assert stored == [args, args]
