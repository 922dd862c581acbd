"""Tables: ``Job`` (the queue and its history), ``JobResult`` (a completed job's return
value), ``Worker`` (one row per live ``runjobs``), ``Queue`` (pause and limits), ``KnownTask``
(when a live worker last knew a task), ``HeldSlot`` (limit slots of runs written off while
their thread goes on), ``Minute`` / ``RollupMark`` (finished jobs counted per minute, for
the pages that show the last hour); signals and events: ``durable/signal_models.py``.

No business logic here: state changes go through the storage façade (``db/store.py``),
fenced by ``lease``, never ``Job.save()``; CHECK constraints hold the invariants.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_pgjobs.conf import get_settings
from django_pgjobs.jobs.chunk_schema import CHUNK_RUN_INDEX, chunk_run_field
from django_pgjobs.jobs.fair_schema import FAIR_INDEX, fair_key_field, weights_field
from django_pgjobs.jobs.managers import JobManager
from django_pgjobs.states import ACTIVE, PRIORITY_MAX, PRIORITY_MIN, TERMINAL, JobStatus
from django_pgjobs.support import decoding
from django_pgjobs.support.installed import require_installed

require_installed("django_pgjobs.models")
# Below the check: a model class of an app Django does not know fails with a vaguer error.
from django_pgjobs.durable import models as durable  # noqa: E402
from django_pgjobs.durable.models import JobStep  # noqa: E402,F401
from django_pgjobs.durable.signal_models import WAITING_FOR_INDEX, JobEvent, JobSignal  # noqa: E402,F401


class StoredJSONField(models.JSONField):
    """A ``JSONField`` whose stored value, when ``json.loads`` cannot decode it (a
    number of more than 4,300 digits, nesting deeper than the recursion limit, as
    psql can write), reads as an ``Undecodable`` placeholder: the one row shows it,
    the page, list or report that read it does not fail. Migrations see a plain
    ``JSONField`` (same column, same deconstruction)."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        try:
            decoded = super().from_db_value(value, expression, connection)
        except (ValueError, RecursionError, MemoryError) as exc:
            return decoding.undecodable(exc)
        if isinstance(value, str | bytes):  # nesting Python 3.12+ decodes, and then chokes on
            return decoding.bounded(value, decoded)
        return decoded

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


class Job(models.Model):
    """One unit of work. Rows are the queue: pending rows are claimed by workers."""

    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=255)
    queue = models.CharField(max_length=100, db_default="default")
    priority = models.SmallIntegerField(db_default=0, help_text="-100..100, higher runs first")
    args = StoredJSONField(db_default=models.Value([], models.JSONField()))
    kwargs = StoredJSONField(db_default=models.Value({}, models.JSONField()))
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
    errors = StoredJSONField(db_default=models.Value([], models.JSONField()))
    last_error = models.TextField(null=True, blank=True)
    timeout = models.FloatField(
        null=True,
        blank=True,
        help_text="seconds a run may take, given per call (empty: the @job's limit or "
        "the default; Infinity: no limit)",
    )
    # Flow control (claim/limited.py): computed at enqueue, read by the limited claim.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    concurrency_limit = models.PositiveSmallIntegerField(null=True, blank=True)
    fair_key = fair_key_field()  # fair shares (claim/fair.py, fair_schema.py)
    # "<mode>:<task>:<key>" of a unique_while or debounced job; held while pending (or
    # running, for "active": the claim clears it for "pending").
    unique_key = models.CharField(max_length=600, null=True, blank=True)
    # debounce.py: first enqueue + max_wait (or + 1000 years); NULL: not debounced
    debounce_until = models.DateTimeField(null=True, blank=True, editable=False)
    trace_context = StoredJSONField(null=True, blank=True, editable=False)  # W3C, of the enqueue
    chunk_run = chunk_run_field()  # chunk handlers: the call it ran in (chunk_schema.py)
    # Workflows (db/workflows.py, db/workflow_trigger.py), all NULL for a plain job:
    # ``workflow_id``: its run (workflow, chain, group, chord or batch); ``waiting``: its
    # parents not finished (NULL: a batch member), > 0 while blocked, released by its
    # last parent's end; ``failed_parents``: its parents that ended dead or cancelled
    # (NULL: none); ``cancelled_by``: the failed parent that cancelled it; ``node``: its name.
    workflow_id = models.BigIntegerField(null=True, blank=True, editable=False)
    node = models.CharField(max_length=255, null=True, blank=True, editable=False)
    waiting = models.IntegerField(null=True, blank=True, editable=False)
    failed_parents = models.IntegerField(null=True, blank=True, editable=False)
    cancelled_by = models.BigIntegerField(null=True, blank=True, editable=False)
    # Reclaimed from a lost worker (the reaper sets it): it runs alone (worker/isolated.py).
    suspect = models.BooleanField(
        db_default=False,
        editable=False,
        help_text="reclaimed from a lost worker: runs alone in a child process until a run ends normally",
    )
    waiting_for = durable.waiting_for_field()  # durable jobs: what it waits for
    wakes = durable.wakes_field()  # ... and a counter every wake bumps (durable/models.py)

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
            # Partial: pending rows stay out (an enqueue pays one index fewer, a claim
            # can never use it), running rows too (running_idx finds those).
            models.Index(
                fields=["status", "-id"],
                name="pgjobs_job_status_idx",
                condition=Q(status__in=sorted(TERMINAL)),
            ),
            # Workflows: the nodes of a run (cancel, the graph, a batch's members),
            # and the blocked jobs per queue (jobs_status, metrics, the repair pass).
            # Partial: plain jobs have no entry in either.
            models.Index(
                fields=["workflow_id", "id"],
                name="pgjobs_job_workflow_idx",
                condition=Q(workflow_id__isnull=False),
            ),
            models.Index(
                fields=["queue", "id"],
                name="pgjobs_job_blocked_idx",
                condition=Q(status=JobStatus.BLOCKED),
            ),
            FAIR_INDEX,
            CHUNK_RUN_INDEX,  # the jobs of one chunk run, for the job page
            durable.WAITING_INDEX,  # durable jobs parked between runs, by wake time
            WAITING_FOR_INDEX,  # ... and by what a wake (a signal, an event) looks for
        ]
        constraints = [
            # Partial: rows without a key stay out of the index (cheaper inserts).
            # ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL uses it.
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgjobs_job_idempotency_key_uniq",
            ),
            # unique_while and debounce: one active job per key. Partial: rows without a
            # key (almost all) stay out of it, and a finished job frees its key.
            models.UniqueConstraint(
                fields=["unique_key"],
                # blocked and waiting too: a workflow node holds its key from its
                # enqueue (its release never collides), a parked job between runs.
                condition=Q(unique_key__isnull=False, status__in=sorted(ACTIVE)),
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
            # A blocked job waits for at least one parent (or its batch).
            models.CheckConstraint(
                condition=~Q(status=JobStatus.BLOCKED) | Q(waiting__isnull=False, waiting__gte=1),
                name="pgjobs_job_blocked_waits",
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
    value = StoredJSONField(null=True, blank=True)
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
    queues = StoredJSONField(default=list)
    concurrency = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())
    # Task names this process has registered: it claims only those (deploy skew).
    tasks = StoredJSONField(
        default=list, blank=True, db_default=models.Value([], models.JSONField())
    )
    # Why it runs without its heartbeat process now; empty while it has one.
    degraded = models.TextField(blank=True, default="", db_default="")

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
    # Epoch seconds of the period's starts (jsonb: ArrayField needs contrib.postgres).
    rate_log = StoredJSONField(
        default=list, blank=True, editable=False, db_default=models.Value([], models.JSONField())
    )
    weights = weights_field()
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


class Workflow(models.Model):
    """One enqueued workflow, chain, group, chord or batch: its jobs carry its id.

    A batch also keeps the count of its members' outcomes here, updated in the
    transaction of each member's move (the trigger of ``db/workflow_trigger.py``), and fires
    its callbacks once it is closed and every member has finished.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=16)
    created_at = models.DateTimeField(db_default=Now())
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # Batches only.
    closed_at = models.DateTimeField(null=True, blank=True)
    members = models.IntegerField(null=True, blank=True)  # how many joined: counted at close
    completed = models.IntegerField(db_default=0)
    dead = models.IntegerField(db_default=0)
    cancelled = models.IntegerField(db_default=0)
    fired_at = models.DateTimeField(null=True, blank=True)
    # [{"id": job id, "when": "complete" | "success" | "failure", "pass": bool}]
    callbacks = StoredJSONField(db_default=models.Value([], models.JSONField()))

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The batches still to fire (the repair pass looks at the closed ones).
            models.Index(
                fields=["id"],
                name="pgjobs_workflow_unfired_idx",
                condition=Q(kind="batch", fired_at__isnull=True),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=["workflow", "chain", "group", "chord", "batch"]),
                name="pgjobs_workflow_kind_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.id} {self.name}"


class JobDependency(models.Model):
    """An edge of a workflow: ``child`` waits for ``parent``. ``position`` orders a
    child's parents (a chord's callback gets the group's results in that order).

    No foreign keys, like ``JobResult``: an FK check would take a KEY SHARE lock on
    the job rows at every insert, and edges outlive a pruned parent (its name stays
    here for ``context.parent_results``).
    """

    pk = models.CompositePrimaryKey("child_id", "position")
    child_id = models.BigIntegerField()
    position = models.IntegerField()
    parent_id = models.BigIntegerField()
    parent_node = models.CharField(max_length=255, null=True, blank=True)
    # What the child does when this parent ends dead or cancelled; the same on
    # every edge of one child.
    on_parent_failure = models.CharField(max_length=8, db_default="cancel")
    # How the child gets its parents' results as arguments: "none" (parent_results
    # only), "first" (a chain: the result first), "list" (a chord: results in order).
    receives = models.CharField(max_length=8, db_default="none")

    class Meta:
        ordering = ["child_id", "position"]
        indexes = [models.Index(fields=["parent_id", "child_id"], name="pgjobs_dep_parent_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(on_parent_failure__in=["cancel", "run"]),
                name="pgjobs_dep_on_parent_failure_valid",
            ),
            models.CheckConstraint(
                condition=Q(receives__in=["none", "first", "list"]),
                name="pgjobs_dep_receives_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.child_id} after #{self.parent_id}"


class HeldSlot(models.Model):
    """A limit slot still held by a run the queue has written off (timed out, cancelled,
    reclaimed) while its thread may still run: Python cannot stop a thread, so the
    limited claim counts these beside the running rows (see
    docs/explanation/guarantees.md). Written in the same statement that writes the run
    off, for jobs with a
    ``concurrency_key`` or of a queue with ``max_running``; deleted by the run's worker
    when the thread has ended, at its exit, or by the reaper once that worker is gone.

    No foreign key to ``Job`` (as ``JobResult``): the slot must outlive a pruned or
    retried row, and the insert takes no lock on the job. One row per run: the job and
    the lease of that run.
    """

    pk = models.CompositePrimaryKey("job_id", "lease")
    job_id = models.BigIntegerField()
    lease = models.BigIntegerField()
    worker = models.CharField(max_length=255)
    queue = models.CharField(max_length=100)
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    since = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["since"]

    def __str__(self) -> str:
        return f"slot of job #{self.job_id} (lease {self.lease}) held by {self.worker}"


class Minute(models.Model):
    """Jobs finished per minute, queue and final status, kept by the rollup pass of every
    worker's maintenance loop (``maintenance/rollup.py``), so that the overview, its charts
    and ``jobs_status`` read minutes, not jobs: their cost follows the number of minutes
    and queues, never the throughput.

    ``finished``: jobs that reached ``status`` during ``minute``. ``waited_since``: the
    earliest ``run_at`` among jobs *claimed* during ``minute`` that had waited (claimed
    after their ``run_at``) and later reached ``status`` (the overview's lag line).
    Counts are events: a job retried and finished again is counted at each finish, and
    pruning a job leaves its minute alone. Rows older than ``ROLLUP_RETENTION`` go.
    """

    pk = models.CompositePrimaryKey("minute", "queue", "status")
    minute = models.DateTimeField()
    queue = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    finished = models.BigIntegerField(db_default=0)
    waited_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["minute", "queue", "status"]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.queue} {self.status}: {self.finished}"


class RollupMark(models.Model):
    """The rollup's one row (``id = 1``): ``Minute`` holds exactly the jobs finished in
    ``[rolled_from, rolled_to)``; readers count the rest from the jobs table. A pass locks
    this row (``FOR UPDATE SKIP LOCKED``), so two workers never count a job twice."""

    id = models.SmallIntegerField(primary_key=True)
    rolled_from = models.DateTimeField(null=True, blank=True)
    rolled_to = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"rolled up from {self.rolled_from} to {self.rolled_to}"
