"""Scenario 10: generated values thrown at every public entry.

``enqueue``, ``using``, ``enqueue_many``, ``Job.objects.enqueue`` and the
commands' options either accept a value — and then it round-trips exactly,
type for type — or refuse it with a clear error (TypeError/ValueError/LookupError
naming what was wrong) and nothing is written. A database error is a failure:
it means the check that should have named the argument was missing.

These run in the test process on pytest-django's database (the machine's server).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.core.management import CommandError
from django.db import DatabaseError, transaction
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from django_pgjobs.management.commands import reap_jobs, runjobs
from django_pgjobs.models import Job
from tests.testapp.jobs import fault_anything

CLEAR_ERRORS = (TypeError, ValueError, LookupError)
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
junk = st.one_of(
    st.tuples(st.integers()),
    st.sets(st.integers(), max_size=2),
    st.binary(max_size=4),
    st.datetimes(),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
    st.builds(object),
    st.decimals(allow_nan=False, allow_infinity=False),
)
values = st.one_of(json_values, json_values, junk)

options = st.fixed_dictionaries(
    {},
    optional={
        "queue": st.one_of(st.text(max_size=120), st.integers(), st.none()),
        "priority": st.one_of(
            st.integers(-150, 150), st.floats(), st.booleans(), st.text(max_size=3)
        ),
        "run_at": st.one_of(
            st.datetimes(timezones=st.none() | st.timezones()), st.text(max_size=3)
        ),
        "delay": st.one_of(
            st.integers(-10, 10**6), st.floats(), st.timedeltas(), st.text(max_size=3)
        ),
        "max_attempts": st.one_of(st.integers(-5, 1100), st.floats(), st.none()),
        "idempotency_key": st.one_of(st.text(max_size=300), st.integers(), st.none()),
        "bogus": st.integers(),
    },
)


def same(a: Any, b: Any) -> bool:
    """Exact round trip: equal values of the same JSON types, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def attempt(action: Any) -> tuple[Any, BaseException | None, int]:
    """Run ``action`` in a savepoint that is always rolled back; returns
    (result, clear error or None, rows written)."""
    result, error, written = None, None, 0
    with transaction.atomic():
        before = Job.objects.count()
        try:
            with transaction.atomic():
                result = action()
        except CLEAR_ERRORS as exc:
            error = exc
        except DatabaseError as exc:  # pragma: no cover - that is the bug we hunt
            pytest.fail(f"the database refused it, no clear error: {exc!r}")
        written = Job.objects.count() - before
        if result is not None and isinstance(result, Job):
            result = Job.objects.get(pk=result.pk)  # what the database holds
        transaction.set_rollback(True)
    if error is not None:
        assert str(error), "an error without a message"
        assert written == 0, "a refused call wrote rows"
    return result, error, written


def check_options_landed(job: Job, opts: dict[str, Any]) -> None:
    for key in ("queue", "priority", "max_attempts", "idempotency_key"):
        if opts.get(key) is not None:
            assert getattr(job, key) == opts[key], key
    if "run_at" in opts:
        assert job.run_at == opts["run_at"]


@SETTINGS
@example(args=[1e16, -0.0, 2**70, "\x00", "\ud800", {"\x00": 1}], kwargs={})
@example(args=[[1.5e300, 5e-324]], kwargs={"x": float("nan")})
@given(
    args=st.lists(values, max_size=3),
    kwargs=st.dictionaries(st.text(max_size=5).filter(str.isidentifier), values, max_size=3),
)
def test_enqueue_round_trips_or_refuses(
    transactional_db: None, args: list[Any], kwargs: dict[str, Any]
) -> None:
    job, error, written = attempt(lambda: fault_anything.enqueue(*args, **kwargs))
    if error is None:
        assert written == 1
        assert same(job.args, args), (args, job.args)
        assert same(job.kwargs, kwargs), (kwargs, job.kwargs)


@SETTINGS
@example(opts={"queue": "a\x00"}, arg=None)
@example(opts={"idempotency_key": "k\x00"}, arg=None)
@example(opts={"queue": "\ud800"}, arg=None)
@example(opts={"run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))}, arg=None)
@example(
    opts={"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))}, arg=None
)
@example(opts={"delay": 10.0**300}, arg=None)
@given(opts=options, arg=values)
def test_using_and_job_objects_enqueue_round_trip_or_refuse(
    transactional_db: None, opts: dict[str, Any], arg: Any
) -> None:
    job, error, _ = attempt(lambda: fault_anything.using(**opts).enqueue(arg))
    if error is None:
        assert same(job.args, [arg])
        check_options_landed(job, opts)
    by_name, error2, _ = attempt(
        lambda: Job.objects.enqueue("tests.testapp.jobs.fault_anything", args=[arg], **opts)
    )
    assert (error is None) == (error2 is None), (error, error2)
    if by_name is not None:
        assert same(by_name.args, [arg])
        check_options_landed(by_name, opts)


@SETTINGS
@given(task=st.text(max_size=40))
def test_job_objects_enqueue_refuses_unregistered_names(transactional_db: None, task: str) -> None:
    _, error, written = attempt(lambda: Job.objects.enqueue(task, args=[]))
    assert isinstance(error, LookupError) and written == 0


@SETTINGS
@given(calls=st.lists(st.lists(values, max_size=2).map(tuple), max_size=5))
def test_enqueue_many_round_trips_or_refuses_all(
    transactional_db: None, calls: list[tuple[Any, ...]]
) -> None:
    def run() -> list[tuple[Any, Any]]:
        n = fault_anything.enqueue_many(calls)
        assert n == len(calls)
        return [(j.args, j.kwargs) for j in Job.objects.order_by("id")]

    def expected(call: tuple[Any, ...]) -> tuple[Any, Any]:
        # Documented: a 2-tuple (list or tuple, dict) is an (args, kwargs) pair.
        if len(call) == 2 and isinstance(call[0], list | tuple) and isinstance(call[1], dict):
            return list(call[0]), call[1]
        return list(call), {}

    stored, error, written = attempt(run)
    if error is None:
        assert written == len(calls)
        for (args, kwargs), call in zip(stored, calls, strict=True):
            want_args, want_kwargs = expected(call)
            assert same(args, want_args) and same(kwargs, want_kwargs), (call, args, kwargs)


OPTION_TEXT = st.one_of(st.text(max_size=8), st.integers(-3, 10**6).map(str), st.floats().map(str))


@SETTINGS
@given(
    flag=st.sampled_from(["--concurrency", "--batch", "--max-jobs", "--poll-interval", "--queues"]),
    value=OPTION_TEXT,
)
def test_runjobs_options_parse_or_refuse(flag: str, value: str) -> None:
    parser = runjobs.Command().create_parser("manage.py", "runjobs")
    try:
        parsed = vars(parser.parse_args([flag, value]))
    except CommandError as exc:
        assert flag.lstrip("-") in str(exc) or "argument" in str(exc)
        return
    got = parsed[flag.lstrip("-").replace("-", "_")]
    if flag == "--poll-interval":
        assert got == float(value) and 0 < got < math.inf
    elif flag == "--queues":
        assert got is None or ",".join(got) == ",".join(
            v.strip() for v in value.split(",") if v.strip()
        )
    else:
        assert got == int(value) and got >= 1


@SETTINGS
@given(value=OPTION_TEXT)
def test_reap_jobs_stale_after_parses_or_refuses(value: str) -> None:
    parser = reap_jobs.Command().create_parser("manage.py", "reap_jobs")
    try:
        parsed = parser.parse_args(["--stale-after", value])
    except CommandError:
        return
    assert parsed.stale_after == float(value) and 0 < parsed.stale_after < math.inf


def test_a_refusal_names_the_argument(transactional_db: None) -> None:
    _, error, written = attempt(lambda: fault_anything.enqueue(1, note="a\x00b"))
    assert "'note'" in str(error) and written == 0
    _, error, _ = attempt(
        lambda: fault_anything.using(run_at=datetime(2030, 1, 1)).enqueue()
    )  # naive
    assert "run_at" in str(error)
    _, error, _ = attempt(
        lambda: fault_anything.using(
            run_at=datetime(2030, 1, 1, tzinfo=UTC), delay=timedelta(1)
        ).enqueue()
    )
    assert "run_at" in str(error) and "delay" in str(error)
