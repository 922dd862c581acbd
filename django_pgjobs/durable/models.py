"""The durable job's tables: ``JobStep`` (one row per finished step, sleep, patch mark
or consumed wait of a job) and the two columns a parked job needs on its own row
(``waiting_for_field``, ``wakes_field``: what it waits for, how often it was woken).

The job's row stays the one source of truth about its run; a step row is written by
a statement that checks the run's lease against the job's row in the same
transaction (``durable/steps.py``), so a run that lost its lease records nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_pgjobs.states import JobStatus

#: The wake pass's index: the waiting rows by wake time, and only those, so a queue
#: with 10,000 sleeping jobs adds nothing to the claim index (partial on pending).
WAITING_INDEX = models.Index(
    fields=["run_at"], name="pgjobs_job_waiting_idx", condition=Q(status=JobStatus.WAITING)
)


def waiting_for_field() -> models.JSONField[Any]:
    """``Job.waiting_for``: while the job is waiting, what it waits for
    (``{"kind": "sleep", "name": ...}``, ``{"kind": "signal", "name": ...}``,
    ``{"kind": "event", "name": ..., "key": ...}``), for the admin and ``jobs_status``;
    NULL otherwise. Made by a call in ``Job``'s body, so the column comes after the
    others (a field of an abstract parent would come first, before ``id``)."""
    return models.JSONField(null=True, blank=True, editable=False)


def wakes_field() -> models.BigIntegerField[int, int]:
    """``Job.wakes``: bumped by every statement that wakes a waiting job, and by an
    event's emit for a running job whose wait looked already, in that statement's
    transaction. The park is conditional on it (``JOB_PARK`` of ``db/durable.py``): a
    wake that commits between the run's last look and its park sends the job back to
    pending instead of leaving it asleep. A signal to a running job does not touch its
    row: the park of a signal wait checks for one itself (``db/job_signals.py``)."""
    return models.BigIntegerField(db_default=0, editable=False)


class JobStep(models.Model):
    """One finished step of a durable job, keyed by (job, name, occurrence).

    ``occurrence``: the n-th call of that name in one run (0 first), so a loop that
    calls the same step name records each call. ``seq``: the order the steps were
    recorded in, which a later run must follow (``NonDeterministic`` otherwise).
    ``kind``: step, atomic, sleep, patch, signal, event. ``result``: the step's
    stored return value (JSON, bounded by ``PGJOBS["MAX_RESULT_BYTES"]``); a sleep
    stores its wake time. Written by the statements of ``durable/steps.py`` only.

    ``job_id`` is a plain ``bigint`` with no foreign key in the database: the check
    would take ``FOR KEY SHARE`` on the running job's row at every step, beside the
    worker's heartbeat and outcome updates of that row (see "No foreign key to the job
    row" in ``docs/explanation/postgres-pitfalls.md``). A job's steps go with it all
    the same: the pruner's statement deletes them with their job, and Django's own
    cascade takes them along on an ORM delete (the admin's).
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        "django_pgjobs.Job",
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="steps",
        db_index=False,  # the unique keys below lead with job_id
    )
    seq = models.IntegerField()
    name = models.CharField(max_length=255)
    occurrence = models.IntegerField(db_default=0)
    kind = models.CharField(max_length=16)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["job_id", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "name", "occurrence"], name="pgjobs_jobstep_name_uniq"
            ),
            # The replay reads a job's steps in order, and two runs racing to record
            # the same position collide here (the fenced one rolls back).
            models.UniqueConstraint(fields=["job", "seq"], name="pgjobs_jobstep_seq_uniq"),
            models.CheckConstraint(
                condition=Q(seq__gte=0, occurrence__gte=0), name="pgjobs_jobstep_seq_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"step {self.name!r} #{self.occurrence} of job #{self.job_id}"
