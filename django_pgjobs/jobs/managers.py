"""``Job.objects``: enqueue by name, the querysets the admin and status views use, and
``retry()`` / ``cancel()`` for operating on jobs from code.

The manager is built from the queryset (``Manager.from_queryset``), so every queryset
method is also a manager method without hand forwarding.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Expression, F, Func, IntegerField, Q, TextField
from django.db.models.functions import Cast, Now
from django.db.models.lookups import IsNull
from django.utils import timezone

from django_pgjobs.db import store
from django_pgjobs.jobs import operations
from django_pgjobs.jobs.enqueue import enqueue_by_name
from django_pgjobs.states import ACTIVE, TERMINAL, JobStatus

if TYPE_CHECKING:
    from django_pgjobs.models import Job

#: The order jobs are claimed in: the claim index's order (models.Job.Meta).
CLAIM_ORDER = ("-priority", "run_at", "id")


class StatementParam(Expression):
    """A named parameter (``%(name)s``) of a statement that is compiled once from a
    queryset and then run with the hot path's own parameters (``claim.compiled.claim_statements``).
    It compiles to ``%s`` with itself as the value, which the statement builder turns
    back into ``%(name)s``; such a queryset is compiled, never evaluated."""

    def __init__(self, name: str, output_field: models.Field[Any, Any] | None = None):
        super().__init__(output_field=output_field or models.CharField())
        self.name = name

    def __repr__(self) -> str:
        return f"StatementParam({self.name!r})"

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        return "%s", (self,)


class TextArray(Expression):
    """``<value>::text[]``: a list of strings, or a ``StatementParam`` holding the array
    (the worker passes its task names as one ``text[]`` literal, see ``claim.plain.task_array``)."""

    def __init__(self, value: Sequence[str] | StatementParam):
        super().__init__(output_field=TextField())
        self.value = value

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        if isinstance(self.value, Expression):
            text, params = compiler.compile(self.value)
            return f"{text}::text[]", tuple(params)
        return "%s::text[]", (list(self.value),)


class TransactionNow(Now):
    """``now()``: the start of the current transaction, the clock every time of a job
    is set from (enqueue, retry backoff). Django's ``Now()`` is ``statement_timestamp()``
    on PostgreSQL: the same in a worker's claim (its own transaction), but inside a
    longer transaction (``run_jobs()`` in a test) a job retried with a backoff would
    become due while the transaction lasts, depending on how fast the test runs."""

    def as_postgresql(
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, Any]:
        return self.as_sql(compiler, connection, template="now()", **extra_context)


class ArrayPosition(Func):
    """``array_position(array, element)``: NULL when the element is not in the array."""

    function = "array_position"
    output_field = IntegerField()


class JobQuerySet(models.QuerySet["Job"]):
    def claimable(
        self,
        queues: str | Sequence[str] | Expression | None = None,
        *,
        tasks: Sequence[str] | StatementParam | None = None,
        since: datetime | StatementParam | None = None,
        priority: int | Expression | None = None,
    ) -> JobQuerySet:
        """The jobs a worker claims next, best first: due (``run_at <= now()``, see
        ``TransactionNow``) pending jobs of ``queues``
        (a name, a list of names, None for every queue), only of ``tasks`` when given,
        by priority (highest first), then ``run_at``, then id — the claim index's order —
        locked ``FOR UPDATE SKIP LOCKED`` (so evaluate it inside ``transaction.atomic()``;
        rows another transaction holds are passed over, never waited for).

        This is the worker's claim: ``claim.run.claim`` runs this queryset compiled once into
        the inner SELECT of a single ``WITH picked AS (...) UPDATE ... RETURNING``
        statement (queue, task names and LIMIT become that statement's parameters).
        The task filter is ``array_position(tasks, task) IS NOT NULL``, not ``task IN
        (...)``: see ``claim/plain.py`` on how the planner estimates the two.
        ``since``: only jobs with ``run_at >= since``, an index condition that skips
        the entries of jobs already claimed without reading their rows
        (``claim/front.py``). ``priority``: only jobs of this priority; with ``since``,
        the scan seeks straight to the bound in that priority's part of the index."""
        qs = self.filter(status=JobStatus.PENDING, run_at__lte=TransactionNow())
        if since is not None:
            qs = qs.filter(run_at__gte=since)
        if priority is not None:
            qs = qs.filter(priority=priority)
        if isinstance(queues, str | Expression):
            qs = qs.filter(queue=queues)
        elif queues is not None:
            qs = qs.filter(queue__in=list(queues))
        if tasks is not None:
            names = TextArray([tasks] if isinstance(tasks, str) else tasks)
            position = ArrayPosition(names, Cast(F("task"), TextField()))
            qs = qs.filter(IsNull(position, False))  # array_position(...) IS NOT NULL
        return qs.order_by(*CLAIM_ORDER).select_for_update(skip_locked=True)

    def pending(self) -> JobQuerySet:
        return self.filter(status=JobStatus.PENDING)

    def due(self) -> JobQuerySet:
        return self.filter(status=JobStatus.PENDING, run_at__lte=timezone.now())

    def running(self) -> JobQuerySet:
        return self.filter(status=JobStatus.RUNNING)

    def stuck(self, stale_after: float | None = None) -> JobQuerySet:
        """Running with a heartbeat older than ``STALE_AFTER``."""
        return self.filter(
            status=JobStatus.RUNNING,
            heartbeat_at__lt=timezone.now() - timedelta(seconds=_stale(stale_after)),
        )

    def dead(self) -> JobQuerySet:
        return self.filter(status=JobStatus.DEAD)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=sorted(TERMINAL))

    def retryable(self, stale_after: float | None = None) -> JobQuerySet:
        """The jobs ``retry()`` would change: dead, cancelled, or stuck running."""
        stale = timezone.now() - timedelta(seconds=_stale(stale_after))
        return self.filter(
            Q(status__in=[JobStatus.DEAD, JobStatus.CANCELLED])
            | Q(status=JobStatus.RUNNING, heartbeat_at__lt=stale)
        )

    def cancellable(self) -> JobQuerySet:
        """The jobs ``cancel()`` would change: blocked, waiting, pending or running."""
        return self.filter(status__in=sorted(ACTIVE))

    def retry(self, *, stale_after: float | None = None) -> int:
        """Put the selected dead, cancelled or stuck jobs back to pending, due now, attempts
        reset, lease bumped (a stuck job's zombie is fenced) — the admin's Retry action.
        A workflow job whose parents have not all finished goes back to blocked, and
        the dependents its failure cancelled wait for it again. Other jobs in the
        selection are left alone. Returns how many jobs changed."""
        return len(operations.retry(self, stale_after=stale_after).changed)

    def retry_detailed(self, *, stale_after: float | None = None) -> store.Retried:
        """``retry()``, also saying which jobs were skipped because their
        ``unique_while`` key is held by another pending or running job (docs/reference/api.md:
        like a
        second enqueue of the key, such a retry writes nothing): ``.changed`` is the set
        of retried ids, ``.held`` maps each skipped id to the id of the holder."""
        return operations.retry(self, stale_after=stale_after)

    def cancel(self) -> int:
        """Cancel the selected blocked, waiting, pending or running jobs (lease bumped, so a running job's
        result is rejected and its ``context.is_cancelled()`` turns true) — the admin's
        Cancel action. Returns how many jobs changed."""
        return len(operations.cancel(self))


def _stale(stale_after: float | None) -> float:
    from django_pgjobs.conf import get_settings

    return get_settings().STALE_AFTER if stale_after is None else stale_after


_BaseJobManager = models.Manager.from_queryset(JobQuerySet)


class JobManager(_BaseJobManager["Job"]):
    def enqueue(self, task: str, *, args: Any = None, kwargs: Any = None, **options: Any) -> Job:
        """Enqueue a registered job by name; same options and guarantees as ``.enqueue()``."""
        return enqueue_by_name(
            task, model=self.model, args=args, kwargs=kwargs, using=self._db, **options
        )

    async def aenqueue(
        self, task: str, *, args: Any = None, kwargs: Any = None, **options: Any
    ) -> Job:
        """``enqueue`` for async code; same options and guarantees."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.enqueue)(task, args=args, kwargs=kwargs, **options)
