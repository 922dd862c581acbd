"""pgjobs_job_status_idx without running rows: a claim moves a row to running, and
that row no longer gets an entry in this index (one index insert fewer per job;
the admin and jobs_status find running rows through pgjobs_job_running_idx).

Built CONCURRENTLY, so writers (enqueues, claims, completions) are not blocked while
the index is rebuilt on a large history; hence a non-atomic migration. Reversible.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgjobs", "0006_trace_context")]

    operations = [
        RemoveIndexConcurrently(model_name="job", name="pgjobs_job_status_idx"),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["cancelled", "completed", "dead"])),
                fields=["status", "-id"],
                name="pgjobs_job_status_idx",
            ),
        ),
    ]
