"""The registry: task name -> ``JobDefinition``.

Only functions registered here are ever executed. A worker claims only the tasks
it has registered; a row naming a task no live worker knows waits, and is
dead-lettered as "unknown task" only after ``UNKNOWN_TASK_TIMEOUT``
(``maintenance/unknown_tasks.py``). Nothing is ever imported by the dotted path stored
in a row.
"""

from __future__ import annotations

import difflib
import threading
from typing import TYPE_CHECKING

from django_pgjobs.exceptions import UnknownTask

if TYPE_CHECKING:
    from django_pgjobs.jobs.definition import JobDefinition

#: Where ``@job`` functions must live to be found (said in errors and docs).
DISCOVERY_HINT = (
    "@job functions are registered when their module is imported: django-pgjobs imports "
    "the `jobs` module of every installed app (myapp/jobs.py) and the modules listed in "
    "PGJOBS['JOB_MODULES']; a @job defined anywhere else is unknown to workers"
)

_lock = threading.Lock()
_registry: dict[str, JobDefinition] = {}
# The queues that @job(fair_key=...) tasks enqueue to by default (None: to be computed
# again after a change of the registry): read by every enqueue.
_fair_queues: frozenset[str] | None = None


def register(definition: JobDefinition) -> None:
    """Add ``definition``; a different function under a taken name is an error."""
    with _lock:
        existing = _registry.get(definition.name)
        if existing is not None and not _same_function(existing, definition):
            raise ValueError(
                f"a job named {definition.name!r} is already registered "
                f"({existing.func.__module__}.{existing.func.__qualname__}); "
                f"pass @job(name=...) to give one of them another name"
            )
        _registry[definition.name] = definition
        _changed()


def _same_function(a: JobDefinition, b: JobDefinition) -> bool:
    # A re-imported module (runserver autoreload, tests) re-registers the same function.
    return (a.func.__module__, a.func.__qualname__) == (b.func.__module__, b.func.__qualname__)


def unregister(name: str) -> None:
    with _lock:
        _registry.pop(name, None)
        _changed()


def _changed() -> None:
    global _fair_queues
    _fair_queues = None


def fair_queues() -> frozenset[str]:
    """The default queues of the tasks that declare a ``fair_key`` (cached until the
    registry changes)."""
    global _fair_queues
    queues = _fair_queues
    if queues is None:
        with _lock:
            queues = frozenset(d.queue for d in _registry.values() if d.fair_key is not None)
            _fair_queues = queues
    return queues


def get(name: str) -> JobDefinition:
    """The definition of ``name``, or ``UnknownTask`` listing close names."""
    try:
        return _registry[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_registry), n=3, cutoff=0.5)
        hint = f" Close names: {', '.join(close)}." if close else ""
        raise UnknownTask(
            f"unknown task {name!r}: no @job function is registered under that name.{hint} "
            f"({DISCOVERY_HINT}.)"
        ) from None


def import_job_modules(modules: list[str]) -> None:
    """Import ``PGJOBS["JOB_MODULES"]`` (for @job functions outside apps' ``jobs`` modules)."""
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"PGJOBS['JOB_MODULES'] lists {module!r}, which cannot be imported: {exc}"
            ) from exc


def find(name: str) -> JobDefinition | None:
    return _registry.get(name)


def all_definitions() -> list[JobDefinition]:
    return list(_registry.values())
