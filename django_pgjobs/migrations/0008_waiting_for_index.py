"""The index a signal or an event finds its waiting jobs by: the jobs table's rows that
wait for something (``waiting_for``), and only those. Built CONCURRENTLY (outside a
transaction), so enqueues and claims go on while it is built; empty until a job
waits."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgjobs", "0007_job_debounce_until")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("waiting_for__isnull", False)),
                fields=["waiting_for"],
                name="pgjobs_job_waiting_for_idx",
            ),
        ),
    ]
