"""Backoff: exponential with full jitter (AWS architecture blog's "Full Jitter").

``uniform(0, min(cap, base * 2**(attempt-1)))``: retries of many failing jobs
spread out instead of hammering a struggling dependency in lockstep.
"""

from __future__ import annotations

import random


def backoff(attempt: int, *, base: float, cap: float, rand: random.Random | None = None) -> float:
    """Seconds to wait before the next try after failed attempt number ``attempt`` (1-based)."""
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base overflows nothing; the cap wins
    ceiling = min(cap, base * (2.0**exponent))
    return (rand or random).uniform(0.0, ceiling)
