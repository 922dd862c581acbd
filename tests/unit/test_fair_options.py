"""``@job(fair_key=...)`` and the weights: what is refused, at decoration, at enqueue
and in the setting (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgjobs.jobs.definition import make_definition
from django_pgjobs.jobs.fair_schema import weights_problems
from django_pgjobs.jobs.keys import fair_key, format_check


def tenant_job(tenant_id: int, rows: int = 0) -> None: ...


@pytest.mark.parametrize(
    ("key", "error", "fragment"),
    [
        (5, TypeError, "@job(fair_key=...) of t must be a format string"),
        ("", ValueError, "@job(fair_key=...) of t must not be empty"),
        ("t:{0}", ValueError, "not positions"),
        ("t:{nope}", ValueError, "@job(fair_key='t:{nope}') of t names 'nope'"),
        ("t:{", ValueError, "not a valid format string"),
    ],
)
def test_a_bad_fair_key_is_refused_at_decoration(key: Any, error: type, fragment: str) -> None:
    with pytest.raises(error) as caught:
        make_definition(tenant_job, name="t", fair_key=key)
    assert fragment in str(caught.value)


def test_the_fair_key_is_built_from_the_arguments_by_name() -> None:
    definition = make_definition(tenant_job, name="t", fair_key="tenant:{tenant_id}")
    assert fair_key(definition, [7], {}) == "tenant:7"
    assert fair_key(definition, [], {"tenant_id": 8, "rows": 1}) == "tenant:8"
    by_call = make_definition(tenant_job, name="t2", fair_key=lambda tenant_id, rows=0: None)
    assert fair_key(by_call, [1], {}) is None  # no key for this call


def test_a_call_the_fair_key_cannot_be_built_from_is_refused() -> None:
    definition = make_definition(tenant_job, name="t", fair_key="tenant:{tenant_id}")
    with pytest.raises(ValueError) as caught:
        format_check(definition, [], {})
    assert "fair_key 'tenant:{tenant_id}' of t: this call has no" in str(caught.value)
    raising = make_definition(tenant_job, name="t3", fair_key=lambda tenant_id, rows=0: 1 / 0)
    with pytest.raises(ValueError, match="fair_key of t3 raised ZeroDivisionError"):
        fair_key(raising, [1], {})
    too_long = make_definition(tenant_job, name="t4", fair_key=lambda tenant_id, rows=0: "x" * 256)
    with pytest.raises(ValueError, match="must be 1-255 characters"):
        fair_key(too_long, [1], {})


def test_weights_must_be_whole_numbers_from_1_to_1000() -> None:
    assert weights_problems({"tenant:1": 3, "tenant:2": 1000}) == []
    assert weights_problems(None) == []
    assert weights_problems([1]) == ["weights must be a dict of fair key -> weight, got list"]
    assert weights_problems({"a": 0}) == ["weights['a'] must be from 1 to 1000, got 0"]
    assert weights_problems({"a": True}) == ["weights['a'] must be a whole number, got True"]
    assert weights_problems({"": 2}) == [
        "weights has a key that is not a fair key (1-255 characters): ''"
    ]
