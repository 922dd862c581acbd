"""Tables: ``Job`` (the queue and its history), ``JobResult`` and ``Worker``.

No business logic lives here. State changes go through ``sql.py`` (fenced by
``lease``), never through ``Job.save()``. The schema holds the invariants as
CHECK constraints so that no code path, ours or a user's psql session, can
break them.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_pgjobs.apps import require_installed
from django_pgjobs.managers import JobManager
from django_pgjobs.states import ACTIVE, PRIORITY_MAX, PRIORITY_MIN, TERMINAL, JobStatus

require_installed("django_pgjobs.models")


class Job(models.Model):
    """One unit of work. Rows are the queue: pending rows are claimed by workers."""

    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=255)
    queue = models.CharField(max_length=100, db_default="default")
    priority = models.SmallIntegerField(db_default=0, help_text="-100..100, higher runs first")
    args = models.JSONField(db_default=models.Value([], models.JSONField()))
    kwargs = models.JSONField(db_default=models.Value({}, models.JSONField()))
    status = models.CharField(
        max_length=16, choices=JobStatus.choices, db_default=JobStatus.PENDING
    )
    run_at = models.DateTimeField(db_default=Now())
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField(db_default=5)
    lease = models.BigIntegerField(db_default=0, help_text="fencing token, bumped on every claim")
    worker = models.CharField(max_length=255, null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    errors = models.JSONField(db_default=models.Value([], models.JSONField()))
    last_error = models.TextField(null=True, blank=True)
    timeout = models.FloatField(
        null=True, blank=True, help_text="seconds a run may take (empty: no limit)"
    )
    # Flow control (flow.py): computed at enqueue, read by the limited claim.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    concurrency_limit = models.PositiveSmallIntegerField(null=True, blank=True)
    # "<task>:<key>" of a @job(unique_while=...) job; held while pending (or
    # running, for "active": the claim clears it for "pending").
    unique_key = models.CharField(max_length=600, null=True, blank=True)
    # W3C trace context (traceparent, tracestate) of the enqueue, when OpenTelemetry
    # is in use: the worker's span for the job is its child. NULL otherwise.
    trace_context = models.JSONField(null=True, blank=True, editable=False)

    objects = JobManager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The claim index: partial, so it holds only live work and stays in
            # shared buffers however large the history grows.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="pgjobs_job_claim_idx",
                condition=Q(status=JobStatus.PENDING),
            ),
            # The reaper's index: only running rows, by heartbeat age.
            models.Index(
                fields=["heartbeat_at"],
                name="pgjobs_job_running_idx",
                condition=Q(status=JobStatus.RUNNING),
            ),
            # The pruner's index: finished rows by age (never touched by the claim).
            models.Index(
                fields=["finished_at"],
                name="pgjobs_job_finished_idx",
                condition=Q(finished_at__isnull=False),
            ),
            # Admin/status filters by status newest-first without scanning history.
            # Partial: pending rows stay out, so an enqueue pays one index fewer and
            # the planner can never pick this index (plus a sort) for a claim; running
            # rows too (since 0007), so a claim pays one fewer (running_idx finds the
            # few running rows).
            models.Index(
                fields=["status", "-id"],
                name="pgjobs_job_status_idx",
                condition=Q(status__in=sorted(TERMINAL)),
            ),
        ]
        constraints = [
            # Partial: rows without a key stay out of the index (cheaper inserts).
            # ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL uses it.
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgjobs_job_idempotency_key_uniq",
            ),
            # unique_while: one active job per key. Partial: rows without a key (almost
            # all) stay out of it, and a finished job frees its key.
            models.UniqueConstraint(
                fields=["unique_key"],
                condition=Q(
                    unique_key__isnull=False, status__in=[JobStatus.PENDING, JobStatus.RUNNING]
                ),
                name="pgjobs_job_unique_active_uniq",
            ),
            models.CheckConstraint(
                condition=Q(concurrency_key__isnull=True, concurrency_limit__isnull=True)
                | Q(concurrency_key__isnull=False, concurrency_limit__gte=1),
                name="pgjobs_job_concurrency_key_limit",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="pgjobs_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in JobStatus]),
                name="pgjobs_job_status_valid",
            ),
            # finished_at is set exactly in the terminal states.
            models.CheckConstraint(
                condition=(
                    Q(status__in=sorted(TERMINAL), finished_at__isnull=False)
                    | Q(status__in=sorted(ACTIVE), finished_at__isnull=True)
                ),
                name="pgjobs_job_finished_iff_terminal",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1, attempts__gte=0)
                & Q(attempts__lte=models.F("max_attempts")),
                name="pgjobs_job_attempts_in_bounds",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.task} [{self.status}]"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def result(self) -> Any:
        """The stored return value of a completed job, or ``None``. Read from the
        database the row came from, else from ``PGJOBS["DATABASE"]``."""
        from django_pgjobs.conf import get_settings

        alias = self._state.db or get_settings().DATABASE
        row = JobResult.objects.using(alias).filter(job_id=self.id).first()
        return None if row is None else row.value


class JobResult(models.Model):
    """The return value of a completed job.

    Written in the same statement that marks the job completed. Deliberately no
    foreign key to ``Job``: an FK check would take a KEY SHARE row lock on the job
    row at every insert, and the result must outlive the pruned job so that its
    idempotency key keeps protecting against a re-run.
    """

    job_id = models.BigIntegerField(primary_key=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    value = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-job_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgjobs_result_idempotency_key_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"result of #{self.job_id}"


class Worker(models.Model):
    """One live ``runjobs`` process, refreshed with every heartbeat."""

    id = models.CharField(max_length=255, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())
    # Task names this process has registered: it claims only those (deploy skew).
    tasks = models.JSONField(
        default=list, blank=True, db_default=models.Value([], models.JSONField())
    )

    class Meta:
        ordering = ["-last_seen"]

    def __str__(self) -> str:
        return self.id


RATE_PATTERN = r"^[1-9][0-9]{0,8}/[smh]$"


class Queue(models.Model):
    """Runtime state and limits of one queue, enforced by every worker's claim.

    A queue without a row (or with an empty one) is unlimited. ``PGJOBS["QUEUES"]``
    is synced into these rows at ``migrate`` and at worker start; the admin edits
    them at runtime. ``rate_log`` holds the start times of the last period (the
    sliding window of the rate limit, epoch seconds); nobody edits it by hand.
    """

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False, db_default=False)
    max_running = models.PositiveIntegerField(
        null=True, blank=True, help_text="jobs of this queue running at once, across all workers"
    )
    rate = models.CharField(
        max_length=20,
        null=True,
        blank=True,
        help_text='job starts per period across all workers: "N/s", "N/m" or "N/h"',
    )
    # Epoch seconds of the starts in the last period (jsonb: no dependency on
    # django.contrib.postgres, whose ArrayField Django 6.1 wants in INSTALLED_APPS).
    rate_log = models.JSONField(
        default=list, blank=True, editable=False, db_default=models.Value([], models.JSONField())
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_running__gte=1) | Q(max_running__isnull=True),
                name="pgjobs_queue_max_running_positive",
            ),
            models.CheckConstraint(
                condition=Q(rate__regex=RATE_PATTERN) | Q(rate__isnull=True),
                name="pgjobs_queue_rate_format",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_limited(self) -> bool:
        return bool(self.paused or self.max_running or self.rate)


class KnownTask(models.Model):
    """When a live worker last knew a task name (deploy skew: a pending job whose task
    no live worker has known for ``UNKNOWN_TASK_TIMEOUT`` is dead-lettered)."""

    name = models.CharField(max_length=255, primary_key=True)
    last_known = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
