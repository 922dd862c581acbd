"""``@job`` validates its options at decoration time."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgjobs import job
from django_pgjobs.decorators import JobFunction
from django_pgjobs.jobs import registry


def module_level(a: int) -> int:
    return a


def other_module_level(a: int) -> int:
    return a


@pytest.fixture(autouse=True)
def _cleanup() -> Any:
    yield
    for name in (
        "tests.unit.test_decorator.module_level",
        "custom.name",
        "tests.unit.test_decorator.ctx",
    ):
        registry.unregister(name)


def test_bare_and_with_options() -> None:
    fn = job(module_level)
    assert isinstance(fn, JobFunction)
    assert fn.name == "tests.unit.test_decorator.module_level"
    assert registry.get(fn.name).func is module_level
    named = job(name="custom.name", queue="q", priority=-3, max_attempts=2)(module_level)
    d = named.definition
    assert (d.name, d.queue, d.priority, d.max_attempts) == ("custom.name", "q", -3, 2)


@pytest.mark.parametrize(
    ("options", "exc", "fragment"),
    [
        ({"priority": 200}, ValueError, "priority"),
        ({"queue": ""}, ValueError, "queue"),
        ({"max_attempts": 0}, ValueError, "max_attempts"),
        ({"retry_on": "ValueError"}, TypeError, "exception classes"),
        ({"discard_on": [int]}, TypeError, "exception classes"),
        ({"quue": "x"}, TypeError, "Did you mean 'queue'"),
        ({"cron": ""}, ValueError, "cron"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], exc: type, fragment: str) -> None:
    with pytest.raises(exc, match=fragment):
        job(**options)(module_level)
    assert registry.find("tests.unit.test_decorator.module_level") is None


def test_nested_functions_and_lambdas_are_refused() -> None:
    def inner() -> None:
        pass

    with pytest.raises(TypeError, match="module level"):
        job(inner)
    with pytest.raises(TypeError, match="module level"):
        job(lambda: None)


def test_takes_context_needs_a_first_parameter() -> None:
    with pytest.raises(TypeError, match="first parameter"):
        job(takes_context=True)(_no_params)


def _no_params() -> None:
    pass


def test_one_name_cannot_be_taken_twice() -> None:
    job(name="custom.name")(module_level)
    with pytest.raises(ValueError, match="already registered"):
        job(name="custom.name")(other_module_level)


def test_should_retry_rules() -> None:
    class A(Exception):
        pass

    class B(Exception):
        pass

    d = job(name="custom.name", retry_on=(A,), discard_on=(B,))(module_level).definition
    assert d.should_retry(A()) and not d.should_retry(B()) and not d.should_retry(ValueError())
