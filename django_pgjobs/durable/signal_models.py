"""The tables of signals and events: ``JobSignal`` (a message to one job, consumed
once by its ``wait_for_signal``) and ``JobEvent`` (a named fact, by key, that every job
waiting on it sees).

No business logic lives here: ``durable/signals.py`` and ``durable/events.py`` write
the rows through the statements of ``db/signals.py``.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

#: The wakers' index on the jobs table: the rows that wait for something, or are about
#: to (an event wait's look writes it before the park), by what they wait for, so a
#: signal or an event finds its waiting jobs in one probe. Only those rows: a plain
#: job pays nothing for it.
WAITING_FOR_INDEX = models.Index(
    fields=["waiting_for"],
    name="pgjobs_job_waiting_for_idx",
    condition=Q(waiting_for__isnull=False),
)


class JobSignal(models.Model):
    """A signal sent to one job (``send_signal``). Kept until a ``wait_for_signal`` of
    its name consumes it (the oldest first), and deleted with its job: the pruner's
    statement deletes them with their job, and Django's cascade on an ORM delete. No
    foreign key in the database, like the steps' (``durable/models.py`` says why)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        "django_pgjobs.Job",
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="signals",
    )
    name = models.CharField(max_length=255)
    payload = models.JSONField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    consumed_at = models.DateTimeField(null=True, blank=True)
    # The step of the run that consumed it ("<name>#<occurrence>").
    consumed_by = models.CharField(max_length=300, null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # The wait's lookup: the oldest unconsumed signal of a name, per job.
            models.Index(
                fields=["job", "name", "id"],
                name="pgjobs_signal_unconsumed_idx",
                condition=Q(consumed_at__isnull=True),
            ),
            # The pruner's delete of a pruned job's signals, consumed ones included.
            models.Index(fields=["job"], name="pgjobs_signal_job_idx"),
        ]
        constraints = [
            # A duplicate key is a no-op (send_signal's ON CONFLICT DO NOTHING).
            models.UniqueConstraint(
                fields=["job", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgjobs_signal_key_uniq",
            ),
            models.CheckConstraint(
                condition=Q(consumed_at__isnull=True) | Q(consumed_by__isnull=False),
                name="pgjobs_signal_consumed_by_a_step",
            ),
        ]

    def __str__(self) -> str:
        return f"signal {self.name!r} to #{self.job_id}"


class JobEvent(models.Model):
    """An event (``emit_event``): every job waiting on its ``(name, key)`` is woken, and
    a wait that begins up to its lookback later still sees it. Pruned by age
    (``PGJOBS["EVENT_RETENTION"]``), not by job."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    key = models.CharField(max_length=255, null=True, blank=True)
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]
        indexes = [
            # The wait's lookup: the events of (name, key) since the wait's lookback.
            models.Index(fields=["name", "key", "created_at"], name="pgjobs_event_lookup_idx"),
            # The pruner's walk, oldest first.
            models.Index(fields=["created_at"], name="pgjobs_event_created_idx"),
        ]

    def __str__(self) -> str:
        return f"event {self.name!r} ({self.key!r})"
