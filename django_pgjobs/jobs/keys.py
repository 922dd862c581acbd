"""Keys computed at enqueue: the concurrency key, the fair key and the unique-while key.

They are computed from the job's arguments when it is enqueued and stored on the
row, so the claim (concurrency, fair shares) and the unique index (unique_while) work
on plain columns and never call Python.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_pgjobs.jobs.definition import JobDefinition

UNIQUE_WHILE = ("pending", "active")
#: The key options of ``@job`` computed from a call's arguments.
KEY_OPTIONS = ("concurrency_key", "fair_key")
#: Highest concurrency_limit (a smallint column).
MAX_CONCURRENCY_LIMIT = 32767


def check_concurrency(
    key: Any, limit: Any, task: str
) -> tuple[str | Callable[..., Any] | None, int]:
    """Validate ``@job(concurrency_key=..., concurrency_limit=...)`` at decoration time."""
    if limit is not None and (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_CONCURRENCY_LIMIT
    ):
        raise ValueError(
            f"@job(concurrency_limit=...) of {task} must be a whole number from 1 to "
            f"{MAX_CONCURRENCY_LIMIT}, got {limit!r}"
        )
    if key is None:
        if limit is not None:
            raise TypeError(
                f"@job(concurrency_limit=...) of {task} needs a concurrency_key "
                "(the jobs that share a key share the limit)"
            )
        return None, 1
    return check_key_option(key, "concurrency_key", task), limit or 1


def check_key_option(
    key: Any, option: str, task: str, label: str | None = None
) -> str | Callable[..., Any] | None:
    """Validate a key option (``concurrency_key``, ``fair_key``, ``debounce_key``) at
    decoration time: a format string naming arguments, or a callable. ``label`` names
    the option in errors (default ``@job(<option>=...)``)."""
    if key is None:
        return None
    name = label or f"@job({option}=...)"
    if isinstance(key, str):
        if not key:
            raise ValueError(f"{name} of {task} must not be empty")
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(key) if f is not None]
        except ValueError as exc:
            raise ValueError(
                f"{name} of {task} is not a valid format string ({exc}): {key!r}"
            ) from None
        for field in fields:
            if not field or field[0].isdigit():
                raise ValueError(
                    f"{name} of {task} must name arguments ({{user_id}}), not positions: {key!r}"
                )
    elif not callable(key):
        raise TypeError(
            f"{name} of {task} must be a format string over the "
            f'job\'s arguments ("user:{{user_id}}") or a callable, got {key!r}'
        )
    checked: str | Callable[..., Any] = key
    return checked


def check_fields_exist(definition: JobDefinition) -> None:
    """A format-string key must name parameters of the function (checked at decoration)."""
    for option in KEY_OPTIONS:
        key = getattr(definition, option)
        if isinstance(key, str):
            check_template_fields(definition, key, f"@job({option}={key!r})")


def check_template_fields(definition: JobDefinition, key: str, label: str) -> None:
    """Each field of the format string ``key`` must be a parameter of the function
    (any name passes when it takes ``**kwargs`` or has no signature)."""
    params = parameters(definition)
    if params is None or any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    for _, field, _, _ in string.Formatter().parse(key):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if root not in params:
            raise ValueError(
                f"{label} of {definition.name} names "
                f"{root!r}, which is not a parameter of the function "
                f"(parameters: {', '.join(params) or 'none'})"
            )


def check_unique_while(value: Any) -> str | None:
    if value is None or value in UNIQUE_WHILE:
        return None if value is None else str(value)
    raise ValueError(f'@job(unique_while=...) must be "pending" or "active", got {value!r}')


def parameters(definition: JobDefinition) -> dict[str, inspect.Parameter] | None:
    try:
        params = dict(inspect.signature(definition.func).parameters)
    except (TypeError, ValueError):
        return None
    if definition.takes_context and params:
        params.pop(next(iter(params)))
    return params


def concurrency_key(
    definition: JobDefinition, args: list[Any], kwargs: dict[str, Any]
) -> str | None:
    """The stored concurrency key of one call (None: the job has no key and no limit)."""
    return computed_key(definition, "concurrency_key", args, kwargs)


def fair_key(definition: JobDefinition, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """The stored fair key of one call (None: the task declares none)."""
    return computed_key(definition, "fair_key", args, kwargs)


def computed_key(
    definition: JobDefinition, option: str, args: list[Any], kwargs: dict[str, Any]
) -> str | None:
    """The value of the key option ``option`` for one call, checked (1-255 characters)."""
    key = getattr(definition, option)
    if key is None:
        return None
    if callable(key):
        try:
            value = key(*args, **kwargs)
        except Exception as exc:
            raise ValueError(
                f"{option} of {definition.name} raised {type(exc).__name__}: {exc}"
            ) from exc
    else:
        value = key.format(**bound_arguments(definition, args, kwargs))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"{option} of {definition.name} must give a string, got {value!r}")
    text = str(value)
    if not text or len(text) > 255:
        raise ValueError(f"{option} of {definition.name} must be 1-255 characters, got {text!r}")
    return text


def bound_arguments(
    definition: JobDefinition, args: list[Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Every argument by name (positional ones too, defaults applied)."""
    values: dict[str, Any] = dict(kwargs)
    params = parameters(definition)
    if params is not None:
        sig = inspect.Signature(list(params.values()))
        try:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            values = {**bound.arguments}
            for p in params.values():
                if p.kind == p.VAR_KEYWORD and p.name in values:
                    values.update(values.pop(p.name))
        except TypeError:
            pass  # check_arguments reports arity problems
    return values


def format_check(definition: JobDefinition, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Raise a clear error when a format-string key cannot be built from this call."""
    for option in KEY_OPTIONS:
        key = getattr(definition, option)
        if isinstance(key, str):
            try:
                key.format(**bound_arguments(definition, args, kwargs))
            except (KeyError, IndexError, AttributeError) as exc:
                raise ValueError(
                    f"{option} {key!r} of {definition.name}: this call has no argument {exc}"
                ) from None


def unique_key(
    definition: JobDefinition, args: list[Any], kwargs: dict[str, Any], given: str | None
) -> str | None:
    """``"<mode>:<task>:<key>"`` for a ``unique_while`` job (default key: a digest of
    the arguments), else None. The mode prefix lets the claim free "pending" keys."""
    mode = definition.unique_while
    if mode is None:
        if given is not None:
            raise TypeError(
                f'.using(unique_key=...) needs @job(unique_while="pending" or '
                f'"active") on {definition.name}'
            )
        return None
    if given is None:
        text = json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"))
        given = "args:" + hashlib.sha256(text.encode()).hexdigest()
    return f"{mode}:{definition.name}:{given}"
