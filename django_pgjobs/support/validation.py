"""Checks on what users pass in: JSON-ness of arguments and the per-call options.

Every error names the argument and what was wrong, and is raised before any row
is written.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django_pgjobs.conf import suggest
from django_pgjobs.states import PRIORITY_MAX, PRIORITY_MIN

#: The longest delay accepted (so now() + delay stays a valid datetime).
MAX_DELAY = timedelta(days=365 * 1000)

#: Options accepted by ``.using()`` and ``Job.objects.enqueue``.
CALL_OPTIONS = frozenset(
    {
        "queue",
        "priority",
        "run_at",
        "delay",
        "max_attempts",
        "idempotency_key",
        "timeout",
        "unique_key",
    }
)


def seconds_of(value: Any, where: str, *, or_none: bool = False) -> float:
    """A duration given as seconds (int or float) or a ``timedelta``, in seconds; the
    caller checks its range. ``where`` names the argument in the error."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    none = ", a timedelta or None" if or_none else " or a timedelta"
    raise TypeError(f"{where} must be seconds (int or float){none}, got {value!r}")


def check_timeout(value: Any, where: str = "timeout") -> float | None:
    """Seconds (int, float or timedelta) a run may take; None means no limit."""
    if value is None:
        return None
    seconds = seconds_of(value, where, or_none=True)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{where} must be a positive number of seconds or None, got {value!r}")
    return seconds


def check_text(value: str, where: str) -> None:
    """PostgreSQL's jsonb cannot store NUL (\\u0000) or lone surrogates: refuse them here,
    naming the argument, instead of failing in the database (or, for a return
    value, wedging the worker's completion batch)."""
    if "\x00" in value:
        raise TypeError(
            f"{where} contains a NUL character (\\x00), which PostgreSQL cannot store in JSON"
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise TypeError(
                f"{where} contains a lone surrogate, which is not valid Unicode "
                "and cannot be stored in JSON"
            ) from None


def _storable_text(value: str, name: str) -> None:
    try:
        check_text(value, name)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


#: Deepest nesting of lists and dicts accepted in arguments and return values:
#: Python's JSON decoder recurses per level, so a deeper value stored today could
#: not be read back by a worker (or the admin) tomorrow.
MAX_DEPTH = 200

#: Python refuses to convert ints of more than 4300 digits to and from text
#: (``sys.set_int_max_str_digits``); this many bits is safely below that.
MAX_INT_BITS = 14_000


def check_json(value: Any, where: str, *, exact_floats: bool = True, _depth: int = 0) -> None:
    """Raise ``TypeError`` unless ``value`` survives a JSON round trip unchanged."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        check_text(value, where)
        return
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise TypeError(
                f"{where} cannot be stored as JSON: an int of about "
                f"{int(value.bit_length() * 0.30103)} digits, more than Python "
                "reads back (about 4,200); pass it as a string"
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where} is {value!r}, which JSON cannot represent")
        if exact_floats and value.is_integer() and abs(value) >= 1e16:
            # jsonb stores numbers as numeric: 1e+16 comes back as the int 10000000000000000.
            raise TypeError(
                f"{where} is the float {value!r}, which PostgreSQL's jsonb gives "
                f"back as an int; pass int(...) or a string"
            )
        return
    if isinstance(value, list | dict) and _depth >= MAX_DEPTH:
        raise TypeError(
            f"{where} is nested too deeply: lists/dicts more than {MAX_DEPTH} "
            "levels deep could not be decoded again"
        )
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json(item, f"{where}[{i}]", exact_floats=exact_floats, _depth=_depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{where} has a non-string key {key!r} ({type(key).__name__}); "
                    "JSON object keys are strings, so it would not round-trip"
                )
            check_text(key, f"a key of {where}")
            check_json(item, f"{where}[{key!r}]", exact_floats=exact_floats, _depth=_depth + 1)
        return
    hint = ""
    if isinstance(value, tuple):
        hint = " (use a list: a tuple comes back from JSON as a list)"
    elif isinstance(value, datetime):
        hint = " (pass value.isoformat() and parse it in the job)"
    elif hasattr(value, "pk"):
        hint = " (pass its primary key and load it in the job)"
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, "
        f"which does not round-trip through JSON{hint}"
    )


#: One encoder for ``json_text``: ``json.dumps(..., ensure_ascii=False)`` would build
#: a new one per call (enqueue's hot path).
_TEXT_ENCODER = json.JSONEncoder(ensure_ascii=False)


def json_text(value: Any) -> str:
    """JSON text of ``value`` for a jsonb column: non-ASCII characters as themselves,
    not ``\\uXXXX`` escapes, and PostgreSQL's own separators (``", "``, ``": "``), so
    its UTF-8 size (``json_bytes``) is the size ``args::text`` has in the database."""
    return _TEXT_ENCODER.encode(value)


def json_bytes(text: str) -> int:
    """UTF-8 bytes of a ``json_text``: the one size ``MAX_ARGS_BYTES`` and
    ``MAX_RESULT_BYTES`` count, in Python as in ``pgjobs_enqueue``
    (``octet_length(args::text)``). ``é`` is 2 bytes, not the 6 of ``\\u00e9``."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def check_size(
    func: Callable[..., Any],
    task: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    size: int,
    *,
    takes_context: bool = False,
) -> None:
    """Refuse arguments whose JSON text (``size``: ``json_bytes`` of args plus
    kwargs) exceeds ``PGJOBS["MAX_ARGS_BYTES"]``, naming the largest argument. Measured
    where the value enters, so a huge row never reaches a worker or the admin."""
    from django_pgjobs.conf import get_settings

    limit = get_settings().MAX_ARGS_BYTES
    if size <= limit:
        return
    _, names, _ = _signature(func, takes_context)
    sizes = [
        (json_bytes(json_text(v)), f"argument {names[i]!r}" if i < len(names) else f"argument #{i}")
        for i, v in enumerate(args)
    ]
    sizes += [(json_bytes(json_text(v)), f"argument {k!r}") for k, v in kwargs.items()]
    largest, name = max(sizes) if sizes else (size, "the arguments")
    raise ValueError(
        f"{task}: {name} is {largest:,} bytes as JSON (all arguments: {size:,} bytes), more "
        f"than PGJOBS['MAX_ARGS_BYTES'] = {limit:,}; store large data elsewhere (a table, "
        "a file, object storage) and pass its key"
    )


def check_result_size(value: Any, task: str) -> None:
    """Refuse a return value whose JSON text exceeds ``PGJOBS["MAX_RESULT_BYTES"]``
    (``TypeError``, like every other unstorable return value: the job fails clearly)."""
    from django_pgjobs.conf import get_settings

    if value is None or isinstance(value, bool | int | float):
        return
    limit = get_settings().MAX_RESULT_BYTES
    size = json_bytes(json_text(value))
    if size > limit:
        raise TypeError(
            f"the return value of {task} is {size:,} bytes as JSON, more than "
            f"PGJOBS['MAX_RESULT_BYTES'] = {limit:,}; store large results "
            "elsewhere and return their key"
        )


@functools.lru_cache(maxsize=1024)
def _signature(
    func: Callable[..., Any], takes_context: bool
) -> tuple[inspect.Signature | None, list[str], tuple[int, int] | None]:
    """The signature arguments are bound against (without the context parameter), its
    positional names, and — when positional-only calls can be checked by counting —
    the (min, max) positional count. Cached: inspect.signature is a visible share of a
    single enqueue, and Signature.bind is paid per row of enqueue_many."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without a signature
        return None, [], None
    params = list(sig.parameters.values())
    if takes_context and params:
        params = params[1:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in positional]
    countable: tuple[int, int] | None = None
    if not any(
        p.kind in (p.VAR_POSITIONAL, p.KEYWORD_ONLY)
        and (p.kind == p.VAR_POSITIONAL or p.default is p.empty)
        for p in params
    ):
        required = sum(1 for p in positional if p.default is p.empty)
        countable = (required, len(positional))
    return sig.replace(parameters=params), names, countable


def check_arguments(
    func: Callable[..., Any],
    task: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    takes_context: bool = False,
) -> None:
    """Check arity against the signature and that every argument is JSON."""
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise TypeError(f"args of {task} must be a list, got {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs of {task} must be a dict, got {type(kwargs).__name__}")
    bound_sig, names, countable = _signature(func, takes_context)
    if countable is not None and not kwargs and countable[0] <= len(args) <= countable[1]:
        pass  # a positional-only call that fits: nothing for bind() to find
    elif bound_sig is not None:
        try:
            bound_sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{task}(): {exc}") from None
    try:
        for i, value in enumerate(args):
            check_json(value, f"argument {names[i]!r}" if i < len(names) else f"argument #{i}")
        for key, value in kwargs.items():
            if not isinstance(key, str):
                raise TypeError(f"keyword names must be strings, got {key!r}")
            check_json(value, f"argument {key!r}")
    except TypeError as exc:
        raise TypeError(f"{task}: {exc}") from None


def check_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"priority must be a whole number between {PRIORITY_MIN} and {PRIORITY_MAX}, "
            f"got {value!r}"
        )
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(
            f"priority must be a whole number between {PRIORITY_MIN} and {PRIORITY_MAX}, "
            f"got {value}"
        )
    return value


def check_queue(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 100:
        raise ValueError(
            f"queue must be a non-empty string of at most 100 characters, got {value!r}"
        )
    if value != value.strip() or "," in value:
        raise ValueError(f"queue must not contain commas or surrounding spaces, got {value!r}")
    _storable_text(value, "queue")
    return value


def check_max_attempts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise ValueError(f"max_attempts must be a whole number from 1 to 1000, got {value!r}")
    return value


def check_key(value: Any, name: str) -> str | None:
    """An ``idempotency_key`` or ``unique_key``: None, or 1-255 characters jsonb can store."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 255:
        raise ValueError(
            f"{name} must be a non-empty string of at most 255 characters, got {value!r}"
        )
    _storable_text(value, name)
    return value


def check_run_at(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"run_at must be an aware datetime, got {type(value).__name__}")
    if (value.tzinfo is None or value.utcoffset() is None) and _use_tz():
        raise ValueError(
            "run_at must be an aware datetime (it has no tzinfo); "
            "use django.utils.timezone.now() + timedelta(...) or pass delay="
        )
    try:
        if value.tzinfo is not None:
            value.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"run_at is out of range (years 1 to 9999 in UTC), got {value!r}"
        ) from None
    return value


def _use_tz() -> bool:
    """With ``USE_TZ = False`` Django's datetimes are naive (in ``TIME_ZONE``); then a
    naive ``run_at`` means that zone, as everywhere else in such a project."""
    from django.conf import settings

    return bool(settings.USE_TZ)


def check_delay(value: Any) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        delay = value
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            delay = timedelta(seconds=value)
        except OverflowError:
            raise ValueError(f"delay is too large, got {value!r}") from None
    else:
        raise TypeError(f"delay must be a timedelta or a number of seconds, got {value!r}")
    if delay < timedelta(0):
        raise ValueError(f"delay must not be negative, got {value!r}")
    if delay > MAX_DELAY:
        raise ValueError(f"delay must be at most {MAX_DELAY.days} days, got {value!r}")
    return delay


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate per-call options; returns them normalised (``delay`` folded into run_at)."""
    out: dict[str, Any] = {}
    for key in options:
        if key not in CALL_OPTIONS:
            raise TypeError(
                f"unknown option {key!r}.{suggest(key, CALL_OPTIONS)}"
                f" Options are: {', '.join(sorted(CALL_OPTIONS))}"
            )
    if "queue" in options:
        out["queue"] = check_queue(options["queue"])
    if "priority" in options:
        out["priority"] = check_priority(options["priority"])
    if "max_attempts" in options:
        out["max_attempts"] = check_max_attempts(options["max_attempts"])
    for key in ("idempotency_key", "unique_key"):
        if key in options:
            out[key] = check_key(options[key], key)
    if "timeout" in options:
        out["timeout"] = check_timeout(options["timeout"], "timeout")
    run_at = check_run_at(options.get("run_at"))
    delay = check_delay(options.get("delay"))
    if run_at is not None and delay is not None:
        raise TypeError("pass either run_at or delay, not both")
    if run_at is not None:
        out["run_at"] = run_at
        out.pop("delay", None)
    elif delay is not None:
        out["delay"] = delay
    return out
