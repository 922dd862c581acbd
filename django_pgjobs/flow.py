"""The queue configuration's former home, kept for the names the docs gave under it
(``django_pgjobs.flow.UnknownQueue``, ``sync_queues``, ``parse_rate``, ``pause_queue``,
``resume_queue``). They live in ``queues.py``; the worker's claim strategy is
``claim/claimant.py``."""

from __future__ import annotations

from django_pgjobs.queues import UnknownQueue, parse_rate, pause_queue, resume_queue, sync_queues

__all__ = ["UnknownQueue", "parse_rate", "pause_queue", "resume_queue", "sync_queues"]
