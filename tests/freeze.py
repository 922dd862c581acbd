"""A real function frozen mid-transaction in a thread of its own: a worker stopped
(SIGSTOP, a paused VM) right after one statement and before its COMMIT, while the test
checks that the others do not wait for it. Real connections, no mocks: only the
pause is patched in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections


def in_thread(call: Callable[[], Any]) -> threading.Thread:
    """Start ``call`` in a daemon thread that closes its own database connection."""

    def target() -> None:
        try:
            call()
        finally:
            connections["default"].close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@contextmanager
def frozen_after(
    monkeypatch: Any, module: Any, name: str, call: Callable[[], Any]
) -> Iterator[None]:
    """Run ``call`` in a thread and hold it right after its call of ``module.name``
    returns (calls of it from other threads go on); release it when the block ends."""
    frozen, release = threading.Event(), threading.Event()
    real = getattr(module, name)
    freezer: list[threading.Thread] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if threading.current_thread() in freezer:
            frozen.set()
            release.wait(120)
        return out

    monkeypatch.setattr(module, name, held)
    freezer.append(in_thread(call))
    try:
        assert frozen.wait(30), f"the thread to freeze never returned from {name}"
        yield
    finally:
        release.set()
        freezer[0].join(30)
