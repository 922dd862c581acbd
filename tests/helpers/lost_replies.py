"""A statement that commits on the server while its client never hears back: the
fault a redo must survive, injected with Django's own ``execute_wrapper``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import OperationalError


def lose_first_reply(*statements: str) -> Callable[..., Any]:
    """An execute wrapper: the first run of each statement commits on the server,
    then the client gets a connection error instead of the reply."""
    seen: set[str] = set()

    def wrapper(
        execute: Callable[..., Any], sql_text: str, params: Any, many: bool, context: Any
    ) -> Any:
        result = execute(sql_text, params, many, context)
        for statement in statements:
            if sql_text == statement and statement not in seen:
                seen.add(statement)
                raise OperationalError("server closed the connection before replying")
        return result

    return wrapper
