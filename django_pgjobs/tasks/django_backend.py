"""``PgJobsBackend``: a ``django.tasks`` backend on the django-pgjobs queue (Django >= 6.0).

Import it as ``django_pgjobs.backend.PgJobsBackend`` (that module also explains
the Django requirement on older versions). Tasks become rows of the jobs table,
written through the caller's connection, and ``runjobs`` runs them next to ``@job``
jobs. The worker-side half lives in ``tasks/bridge.py``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core import checks
from django.db.models import OuterRef, Subquery
from django.tasks import Task, TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from django_pgjobs import signals
from django_pgjobs.conf import get_settings, suggest
from django_pgjobs.jobs.debounce import OPTIONS as DEBOUNCE_OPTIONS
from django_pgjobs.jobs.debounce import Debounce, check_call, check_debounce
from django_pgjobs.jobs.enqueue import enqueue_one
from django_pgjobs.support.validation import check_key, check_max_attempts, check_queue
from django_pgjobs.tasks import bridge

#: Keys accepted in ``TASKS[alias]["OPTIONS"]`` (case-insensitive).
OPTION_KEYS = frozenset({"max_attempts"})

#: Largest value of a bigint primary key.
_MAX_ID = 2**63 - 1


def _debounce(task: Task[..., Any]) -> Debounce | None:
    """The task's debounce options (a ``PgJobsTask``'s), validated."""
    options = {name: getattr(task, name, None) for name in DEBOUNCE_OPTIONS}
    return check_debounce(options, f"task {task.module_path}")


class PgJobsBackend(BaseTaskBackend):
    """Run ``django.tasks`` tasks on django-pgjobs: retries, crash recovery,
    priorities, and an ``enqueue`` that joins the caller's transaction."""

    task_class = bridge.PgJobsTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    # __init__ is Django's: it runs when a module defining tasks is imported, so it
    # must not touch the database. OPTIONS are checked by check().

    def _option(self, key: str) -> Any:
        for name, value in self.options.items():
            if isinstance(name, str) and name.lower() == key:
                return value
        return None

    def default_max_attempts(self) -> int:
        """``OPTIONS["max_attempts"]``, else ``PGJOBS["MAX_ATTEMPTS"]``."""
        value = self._option("max_attempts")
        return int(value) if value is not None else get_settings().MAX_ATTEMPTS

    # -- validation --------------------------------------------------------

    def validate_task(self, task: Task[..., Any]) -> None:
        """Django's rules (and messages), then ours; registers the task for workers."""
        run_after: Any = task.run_after
        if isinstance(run_after, timedelta):
            if run_after < timedelta(0):
                raise InvalidTask("run_after must not be a negative timedelta.")
            super().validate_task(bridge.clone(task, run_after=None))
        else:
            super().validate_task(task)
        try:
            check_queue(task.queue_name)
            max_attempts = getattr(task, "max_attempts", None)
            if max_attempts is not None:
                check_max_attempts(max_attempts)
            check_key(getattr(task, "idempotency_key", None), "idempotency_key")
            plan = _debounce(task)
            if plan is not None:
                check_call(
                    {"idempotency_key": getattr(task, "idempotency_key", None)},
                    f"task {task.module_path}",
                )
                if run_after is not None:
                    raise ValueError(
                        f"run_after cannot be given to a debounced task ({plan.seconds:g} s)"
                    )
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"{exc}.") from None
        for option in ("retry_on", "discard_on"):
            for item in getattr(task, option, ()):
                if not (isinstance(item, type) and issubclass(item, BaseException)):
                    raise InvalidTask(f"{option} takes exception classes, got {item!r}.")
        if len(task.module_path) > bridge.MAX_NAME:
            raise InvalidTask(
                f"Task path {task.module_path!r} is longer than {bridge.MAX_NAME} characters."
            )
        bridge.register(task)

    # -- enqueue -----------------------------------------------------------

    # The stubs' enqueue is generic in the task's signature; the result built from the
    # row is not (TaskResult[..., Any]), which an override may not narrow to.
    def enqueue(  # type: ignore[override]
        self, task: Task[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[..., Any]:
        """INSERT one job through the caller's connection (so inside its transaction)."""
        from django_pgjobs.models import Job  # not at import: see get_result

        self.validate_task(task)
        definition = bridge.register(task)
        job_args, job_kwargs = bridge.arguments(task, args, kwargs)
        run_after: Any = task.run_after
        delay = None
        if isinstance(run_after, timedelta):  # added to the database's clock, as delay= is
            run_after, delay = None, run_after
        options = {
            "queue": task.queue_name,
            "priority": int(task.priority),
            "run_at": run_after,
            "delay": delay,
            "max_attempts": getattr(task, "max_attempts", None) or self._option("max_attempts"),
            "idempotency_key": getattr(task, "idempotency_key", None),
            # the task's own (its definition is shared by every copy of the task)
            "debounce": _debounce(task),
        }
        job = enqueue_one(definition, job_args, job_kwargs, options, model=Job)
        base = bridge.task_for_name(job.task) or definition.task
        result = bridge.result_from_job(
            job, base, self, return_value=job.result if job.status == "completed" else None
        )
        if getattr(job, "_pgjobs_inserted", False):
            # An existing idempotency key wrote nothing: nothing was enqueued to announce.
            signals.send(task_enqueued, type(self), task_result=result)
        return result

    # -- results -----------------------------------------------------------

    def get_result(self, result_id: Any) -> TaskResult[..., Any]:
        """The result of job ``result_id``; ``TaskResultDoesNotExist`` for an id that is
        malformed, unknown, or a ``@job`` (not a django.tasks task)."""
        from django_pgjobs.models import Job, JobResult, StoredJSONField

        text = str(result_id)
        if not text.isascii() or not text.isdigit() or not 0 < int(text) <= _MAX_ID:
            raise TaskResultDoesNotExist(result_id)
        # The stored return value comes with the row: one query per refresh().
        stored = JobResult.objects.filter(job_id=OuterRef("pk")).values("value")[:1]
        job = (
            Job.objects.using(get_settings().DATABASE)
            .annotate(pgjobs_stored_value=Subquery(stored, output_field=StoredJSONField()))
            .filter(pk=int(text))
            .first()
        )
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        base = bridge.task_for_name(job.task)
        if base is None:
            raise TaskResultDoesNotExist(
                f"{result_id} (job {job.id} runs {job.task!r}, which is not a django.tasks task "
                "known to this process)"
            )
        # The plugin does not type attributes added by annotate().
        value = job.pgjobs_stored_value if job.status == "completed" else None  # type: ignore[attr-defined]
        return bridge.result_from_job(job, base, self, return_value=value)

    # -- checks ------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Configuration errors of this backend (run by ``manage.py check``)."""
        from django.apps import apps

        where = f"TASKS[{self.alias!r}]"
        errors: list[checks.CheckMessage] = []
        if not apps.is_installed("django_pgjobs"):
            errors.append(
                checks.Error(
                    f"{where} uses PgJobsBackend but 'django_pgjobs' is not in INSTALLED_APPS",
                    hint="Add 'django_pgjobs' to INSTALLED_APPS and run migrate.",
                    id="django_pgjobs.T001",
                )
            )
        if not isinstance(self.options, dict):
            errors.append(
                checks.Error(f"{where}['OPTIONS'] must be a dict", id="django_pgjobs.T002")
            )
            return errors
        for key in self.options:
            if not isinstance(key, str) or key.lower() not in OPTION_KEYS:
                errors.append(
                    checks.Error(
                        f"{where}['OPTIONS'] has an unknown key {key!r}."
                        f"{suggest(str(key).lower(), OPTION_KEYS)}",
                        hint=f"Known keys: {', '.join(sorted(OPTION_KEYS))}.",
                        id="django_pgjobs.T002",
                    )
                )
        max_attempts = self._option("max_attempts")
        if max_attempts is not None:
            try:
                check_max_attempts(max_attempts)
            except ValueError as exc:
                errors.append(checks.Error(f"{where}['OPTIONS']: {exc}", id="django_pgjobs.T002"))
        for queue in sorted(self.queues):
            try:
                check_queue(queue)
            except ValueError as exc:
                errors.append(
                    checks.Error(f"{where}['QUEUES'] has {queue!r}: {exc}", id="django_pgjobs.T003")
                )
        return errors
