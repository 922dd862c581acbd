"""Which statements move a job from one status to another.

Each module of ``db/`` declares, right after a statement's text, the moves that
statement can make (``declare("JOB_RETRY", (RUNNING, PENDING), (RUNNING, DEAD))``).
``tests/db/test_transitions.py`` holds the declarations to ``states.ALLOWED_TRANSITIONS``
both ways: every declared move is allowed, and every allowed move has a statement.
"""

from __future__ import annotations

#: A move: (from status, to status).
Move = tuple[str, str]

#: statement name -> the moves it can make (filled as the ``db`` modules are imported).
MOVES: dict[str, tuple[Move, ...]] = {}


def declare(statement: str, *moves: Move) -> None:
    """Record that ``statement`` (a constant's name) can make ``moves``."""
    if statement in MOVES:
        raise ValueError(f"the moves of {statement} are declared twice")
    MOVES[statement] = moves
