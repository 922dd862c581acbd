"""The bridge between ``django.tasks`` and the jobs table (Django >= 6.0 only).

Three jobs, kept together because they share one vocabulary:

* ``PgJobsTask``: the backend's ``task_class``, a ``django.tasks.Task`` that also
  carries pgjobs options (``max_attempts``, ``atomic``, ``retry_on``, ...);
* registration: every task the backend validates becomes a ``TaskDefinition`` in
  our registry, so workers run it like any ``@job`` and never import by path;
* translation: a ``Job`` row becomes a ``TaskResult`` (statuses, attempts,
  errors, timestamps), and the worker-side runner sends Django's signals.

Only ``tasks.backend`` and the worker (through the registry) use this module.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from django_pgjobs import durable, signals
from django_pgjobs.conf import get_settings
from django_pgjobs.jobs import registry
from django_pgjobs.jobs.definition import JobDefinition
from django_pgjobs.states import JobStatus
from django_pgjobs.worker import outcomes
from django_pgjobs.worker.executor import never_retry
from django_pgjobs.worker.outcomes import Outcome

if TYPE_CHECKING:
    from django_pgjobs.jobs.context import JobContext
    from django_pgjobs.models import Job

#: Registry-name prefix for a task whose module path is taken by a ``@job(name=...)``.
PREFIX = "django.tasks:"
#: Longest module path a task may have (the ``task`` column holds 255 characters).
MAX_NAME = 255 - len(PREFIX)

STATUS_MAP: dict[str, TaskResultStatus] = {
    JobStatus.BLOCKED: TaskResultStatus.READY,  # a workflow job waiting for its parents
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.WAITING: TaskResultStatus.RUNNING,  # a durable task between its runs: started
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.DEAD: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PgJobsTask(Task):  # type: ignore[type-arg]  # generic in the stubs only: Django's class is not subscriptable
    """A ``django.tasks.Task`` with pgjobs options.

    On Django 6.1 ``@task(max_attempts=3, atomic=True, ...)`` passes these through;
    on 6.0 and 6.1 ``task.using(max_attempts=..., idempotency_key=...)`` sets the
    per-call ones. ``run_after`` may also be a ``timedelta`` (relative to enqueue).
    ``debounce``, ``debounce_key``, ``max_wait`` and ``keep`` are ``@job``'s
    (jobs/debounce.py), set either way.
    """

    max_attempts: int | None = None
    atomic: bool = False
    retry_on: tuple[type[BaseException], ...] = ()
    discard_on: tuple[type[BaseException], ...] = ()
    idempotency_key: str | None = None
    debounce: float | timedelta | None = None
    debounce_key: str | Callable[..., Any] | None = None
    max_wait: float | timedelta | None = None
    keep: str | None = None

    def __post_init__(self) -> None:
        # A single exception class is accepted where a tuple is expected.
        for name in ("retry_on", "discard_on"):
            value = getattr(self, name)
            if isinstance(value, type):
                object.__setattr__(self, name, (value,))
            elif isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        Task.__post_init__(self)

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | timedelta | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        debounce: float | timedelta | None = None,
        debounce_key: str | Callable[..., Any] | None = None,
        max_wait: float | timedelta | None = None,
        keep: str | None = None,
    ) -> PgJobsTask:
        """Django's ``using()`` plus the per-call pgjobs options."""
        changes: dict[str, Any] = {
            "priority": priority,
            "queue_name": queue_name,
            "run_after": run_after,
            "backend": backend,
            "max_attempts": max_attempts,
            "idempotency_key": idempotency_key,
            "debounce": debounce,
            "debounce_key": debounce_key,
            "max_wait": max_wait,
            "keep": keep,
        }
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def clone(task: Task[..., Any], **changes: Any) -> Task[..., Any]:
    """A copy of ``task`` with ``changes``, *without* re-validating it.

    For rebuilding a historical record (the settings may have changed since the
    job was enqueued) and for validating the rest of a task apart from a field.
    Fields the task's class does not have are ignored.
    """
    names = {f.name for f in dataclasses.fields(task)}
    copy = object.__new__(type(task))
    for name in names:
        object.__setattr__(copy, name, changes[name] if name in changes else getattr(task, name))
    return copy


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskDefinition(JobDefinition):
    """A ``JobDefinition`` whose function is a ``django.tasks`` task (in ``extra["task"]``)."""

    @property
    def task(self) -> Task[..., Any]:
        task: Task[..., Any] = self.extra["task"]
        return task


class TaskRunner:
    """What the worker calls for a task: ``runner(job_context, *args, **kwargs)``.

    Its signature is the task function's (minus ``context``) behind a leading
    ``job_context``, so enqueue checks the arguments against the real function.
    """

    def __init__(self, name: str, func: Callable[..., Any], takes_context: bool):
        self.name = name
        self.__module__ = func.__module__
        self.__qualname__ = func.__qualname__
        self.__name__ = func.__name__
        params = list(inspect.signature(func).parameters.values())
        if takes_context and params:
            params = params[1:]
        job_context = inspect.Parameter("job_context", inspect.Parameter.POSITIONAL_ONLY)
        self.__signature__ = inspect.Signature([job_context, *params])

    def __call__(self, job: JobContext, *args: Any, **kwargs: Any) -> Any:
        definition = registry.get(self.name)
        if not isinstance(definition, TaskDefinition):
            raise TypeError(f"{self.name!r} is registered as a @job, not as a django.tasks task")
        return run(definition, job, list(args), dict(kwargs))

    def __repr__(self) -> str:
        return f"<django.tasks task {self.name}>"


def register(task: Task[..., Any]) -> TaskDefinition:
    """Register ``task``'s function (once per function) and return its definition."""
    path = task.module_path
    name = path
    existing = registry.find(name)
    if existing is not None and not isinstance(existing, TaskDefinition):
        name = PREFIX + path  # a @job(name=...) owns the plain path
        existing = registry.find(name)
    if isinstance(existing, TaskDefinition) and existing.task.func is task.func:
        return existing
    definition = TaskDefinition(
        name=name,
        func=TaskRunner(name, task.func, task.takes_context),
        queue=task.queue_name,
        priority=int(task.priority),
        max_attempts=getattr(task, "max_attempts", None),
        atomic=bool(getattr(task, "atomic", False)),
        takes_context=True,  # the runner always receives the JobContext
        retry_on=tuple(getattr(task, "retry_on", ())),
        discard_on=tuple(getattr(task, "discard_on", ())),
        extra={"task": clone(task, run_after=None, idempotency_key=None)},
    )
    registry.register(definition)
    return definition


def task_for_name(name: str) -> Task[..., Any] | None:
    """The registered task behind a job's ``task`` column, or None (a ``@job``, or a
    name this process has not registered).

    Never imports by path: the name comes from a row, which anyone with INSERT
    rights (or ``pgjobs_enqueue``) can write. Tasks are registered when their module
    is imported (every installed app's ``tasks`` module is, at startup).
    """
    definition = registry.find(name)
    return definition.task if isinstance(definition, TaskDefinition) else None


# ---------------------------------------------------------------------------
# Values: arguments in, return values out
# ---------------------------------------------------------------------------


def to_json(value: Any, where: str) -> Any:
    """Django's ``normalize_json`` then a JSON round trip, so what is stored is what
    comes back (tuples become lists, dict keys strings). Errors name ``where``."""
    try:
        return json.loads(json.dumps(normalize_json(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: {exc}") from None
    except RecursionError:
        raise TypeError(f"{where}: nests lists/dicts too deeply to be stored as JSON") from None


def arguments(task: Task[..., Any], args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    path = task.module_path
    out_args = [
        to_json(value, f"positional argument {i} of {path}") for i, value in enumerate(args)
    ]
    out_kwargs = {
        key: to_json(value, f"argument {key!r} of {path}") for key, value in kwargs.items()
    }
    return out_args, out_kwargs


def _return_value(value: Any, path: str) -> Any:
    try:
        return to_json(value, f"the return value of {path}")
    except TypeError as exc:
        never_retry(exc)  # the task ran; running it again cannot fix its value
        raise


# ---------------------------------------------------------------------------
# Rows -> TaskResult
# ---------------------------------------------------------------------------


def _time(value: Any) -> datetime | None:
    """A time from an error entry, aware or naive as ``USE_TZ`` says (entries written
    by the database are aware, those of a ``USE_TZ = False`` worker naive)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    zone = timezone.get_default_timezone()
    if settings.USE_TZ and timezone.is_naive(value):
        return timezone.make_aware(value, zone)
    if not settings.USE_TZ and timezone.is_aware(value):
        return timezone.make_naive(value, zone)
    return value


def _entries(job: Job) -> list[dict[str, Any]]:
    """The row's error entries that are entries (a row psql wrote may hold anything)."""
    errors = job.errors
    return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []


def _errors(job: Job) -> list[TaskError]:
    out = []
    if isinstance(job.errors, str):  # an undecodable history: its placeholder
        out.append(TaskError(exception_class_path="builtins.ValueError", traceback=job.errors))
    for entry in _entries(job):
        path = entry.get("type") or "builtins.Exception"
        text = entry.get("traceback") or f"{path}: {entry.get('message', '')}\n"
        out.append(TaskError(exception_class_path=path, traceback=text))
    if job.status == JobStatus.CANCELLED:
        out.append(
            TaskError(
                exception_class_path="django_pgjobs.exceptions.JobCancelled",
                traceback="django_pgjobs.exceptions.JobCancelled: the job was cancelled\n",
            )
        )
    return out


def _worker_ids(job: Job) -> list[str]:
    """One id per attempt: the worker named on that attempt's error, else the row's."""
    by_attempt: dict[int, str] = {}
    for entry in _entries(job):
        if entry.get("worker") and isinstance(entry.get("attempt"), int):
            by_attempt[entry["attempt"]] = str(entry["worker"])
    current = job.worker or "unknown"
    ids = [by_attempt.get(n, current) for n in range(1, job.attempts)]
    if job.attempts:
        # The latest attempt ran on the row's worker (the last claimer), unless it
        # failed and the row moved on (retry pending / dead): then its error says.
        live = job.status in (JobStatus.RUNNING, JobStatus.COMPLETED)
        ids.append(current if live else by_attempt.get(job.attempts, current))
    return [i[:64] for i in ids]


def _last_started(job: Job) -> datetime | None:
    """When the latest attempt began (a released, uncounted attempt does not count)."""
    return job.started_at if job.attempts or job.errors else None


def _first_started(job: Job) -> datetime | None:
    """When the first attempt began. The row keeps only the latest claim time; an
    error entry gives its attempt's start when recorded, else when it ended."""
    times = [t for t in (_time(e.get("started_at") or e.get("at")) for e in _entries(job)) if t]
    last = _last_started(job)
    if last is not None:
        times.append(last)
    return min(times) if times else None


def result_from_job(
    job: Job,
    base: Task[..., Any],
    backend: Any,
    *,
    return_value: Any = None,
) -> TaskResult[..., Any]:
    """The ``TaskResult`` a ``Job`` row stands for (built the same way for enqueue
    and ``get_result``, so the two compare equal)."""
    fields = {f.name for f in dataclasses.fields(base)}
    changes: dict[str, Any] = {
        "priority": job.priority,
        "queue_name": job.queue,
        # Without run_after the row's run_at is the enqueue transaction's now(),
        # never later than created_at (the statement's time).
        "run_after": job.run_at if job.run_at > job.created_at else None,
        "backend": backend.alias,
    }
    if "max_attempts" in fields:
        default = getattr(base, "max_attempts", None) or backend.default_max_attempts()
        changes["max_attempts"] = (
            getattr(base, "max_attempts", None) if job.max_attempts == default else job.max_attempts
        )
    if "idempotency_key" in fields:
        changes["idempotency_key"] = job.idempotency_key
    result: TaskResult[..., Any] = TaskResult(
        task=clone(base, **changes),
        id=str(job.id),
        status=STATUS_MAP[job.status],
        enqueued_at=job.created_at,
        started_at=_first_started(job),
        finished_at=job.finished_at,
        last_attempted_at=_last_started(job),
        # A row psql wrote may hold anything; an undecodable value is its placeholder.
        args=list(job.args) if isinstance(job.args, list) else [job.args],
        kwargs=dict(job.kwargs) if isinstance(job.kwargs, dict) else {"undecodable": job.kwargs},
        backend=backend.alias,
        errors=_errors(job),
        worker_ids=_worker_ids(job),
    )
    if job.status == JobStatus.COMPLETED:
        object.__setattr__(result, "_return_value", return_value)
    return result


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------


def backend_for(task: Task[..., Any]) -> Any:
    """The PgJobsBackend that reports on ``task``: its own alias, else the first of ours.

    A backend is ours when its tasks are ``PgJobsTask`` (``PgJobsBackend.task_class``):
    asked of the instance, so this module need not import ``tasks/django_backend.py``, which
    imports it."""
    from django.tasks import task_backends

    try:
        backend = task_backends[task.backend]
        if _ours(backend):
            return backend
    except InvalidTaskBackend:  # alias removed from TASKS since (or its backend is gone)
        pass
    for backend in task_backends.all():
        if _ours(backend):
            return backend
    raise InvalidTask(f"no TASKS backend is a PgJobsBackend, so {task.module_path} cannot run")


def _ours(backend: Any) -> bool:
    task_class = getattr(backend, "task_class", None)
    return isinstance(task_class, type) and issubclass(task_class, PgJobsTask)


def run(
    definition: TaskDefinition, job: JobContext, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """Run one attempt of a task inside the worker: RUNNING result -> ``task_started``
    -> call. ``task_finished`` waits for the attempt's outcome to be written (see
    ``_finished``): nobody is told "succeeded" about a write the lease refused."""
    from django_pgjobs.models import Job

    backend = backend_for(definition.task)
    row = Job.objects.using(get_settings().DATABASE).get(pk=job.job_id)
    result = result_from_job(row, definition.task, backend)
    sender = type(backend)
    outcomes.after_write(job.job_id, job.lease, functools.partial(_finished, sender, result))
    signals.send(task_started, sender, task_result=result)
    task = result.task
    if task.takes_context:
        with durable.task_running(job):  # django_pgjobs.durable(context) finds the job
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
    else:
        value = task.call(*args, **kwargs)
    return _return_value(value, task.module_path)


def _finished(
    sender: type,
    result: TaskResult[..., Any],
    outcome: Outcome,
    ours: bool,
) -> None:
    """Send ``task_finished`` for an attempt whose outcome is now in the database.

    Nothing for a fenced attempt (a zombie announces nothing) nor for one that will
    be retried (Django's contract: the signal marks the end of the task). A failure
    is sent from inside an ``except`` block, so Django's log line gets ``exc_info``.
    """
    if not ours or outcome.kind not in ("completed", "dead"):
        return
    object.__setattr__(result, "finished_at", timezone.now())
    if outcome.kind == "completed":
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", outcome.value)
        signals.send(task_finished, sender, task_result=result)
        return
    exc = outcome.exception
    error = outcome.error or {}
    if exc is not None:
        cls = type(exc)
        path = f"{cls.__module__}.{cls.__qualname__}"
        text = "".join(traceback.format_exception(exc))
    else:
        path = str(error.get("type") or "builtins.Exception")
        text = str(error.get("traceback") or f"{path}: {error.get('message', '')}\n")
    result.errors.append(TaskError(exception_class_path=path, traceback=text))
    object.__setattr__(result, "status", TaskResultStatus.FAILED)
    if exc is None:
        signals.send(task_finished, sender, task_result=result)
        return
    try:
        raise exc
    except BaseException:  # noqa: BLE001 - re-raised only to set exc_info for receivers
        signals.send(task_finished, sender, task_result=result)
