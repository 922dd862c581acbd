"""Small helpers the benchmark's scripts share (stdlib only)."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any


def say(*a: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def rss_kb(pid: int) -> int:
    """Resident memory of a process, 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so ``finally`` stops workers and clusters."""

    def leave(signum: int, frame: object) -> None:
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
