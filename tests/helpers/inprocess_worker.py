"""An in-process worker run in a thread of the test until a condition holds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django_pgjobs.worker.loop import Worker
from tests.conftest import wait_until


def running_worker(
    until: Callable[[], Any], *, queues: list[str], concurrency: int = 4, timeout: float = 60
) -> Worker:
    """Run a worker of ``queues`` in a thread until ``until()`` holds; stop it then."""
    worker = Worker(queues=queues, concurrency=concurrency, maintenance=False, poll_interval=0.1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(until, timeout=timeout, message="the jobs to settle")
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive(), "the worker did not stop"
    return worker
