"""Hypothesis strategies for arbitrary JSON-ish values and a burst worker to run them,
for the property tests."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from django_pgjobs.worker.loop import Worker
from tests.conftest import examples, run_burst_worker

PROPERTY_SETTINGS = settings(
    max_examples=examples(40),
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.sampled_from(
        [
            2**63,
            -(2**64),
            10**300,
            10**4299,
            1e16,
            5e-324,
            1.7976931348623157e308,
            "\x00",
            "\ud800",
            "esc\x1b[31m\n",
        ]
    )
)

json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def run_worker_burst() -> Worker:
    worker = Worker(
        burst=True,
        maintenance=False,
        listen=False,
        poll_interval=0.05,
        concurrency=2,
    )
    assert run_burst_worker(worker) == 0, "the worker did not exit normally"
    return worker
