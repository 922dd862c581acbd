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
    # The thread marks itself before it calls: it once reached ``name`` before the
    # thread object was recorded as the one to freeze (a 2-core box under load), ran
    # on unfrozen, and the test failed waiting for it.
    mark = threading.local()

    def held(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if getattr(mark, "freeze", False):
            frozen.set()
            release.wait(120)
        return out

    def marked() -> Any:
        mark.freeze = True
        return call()

    monkeypatch.setattr(module, name, held)
    freezer = in_thread(marked)
    try:
        assert frozen.wait(30), f"the thread to freeze never returned from {name}"
        yield
    finally:
        release.set()
        freezer.join(30)
