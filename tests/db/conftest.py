"""Fixtures that more than one module of the db tier uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_pgjobs.claim import front as claim_front
from django_pgjobs.worker import Worker
from tests.helpers.claim_front import running_in_thread


@pytest.fixture
def probing_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Worker]:
    """A worker whose maintenance runs the claim front's probe alone, every 0.3 s."""
    monkeypatch.setattr(claim_front, "PROBE_EVERY", 0.3)
    worker = Worker(queues=["front"], services=[], concurrency=2, poll_interval=0.2)
    assert [s.name for s in worker.services] == ["claim front"]
    yield from running_in_thread(worker)
