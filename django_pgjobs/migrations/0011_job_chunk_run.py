"""Chunk runs: ``Job.chunk_run`` names the call of a chunk handler a job's outcome came
from (NULL for a job that never ran in a chunk, so a plain job's row and an insert of
the previous release are what they were), and its index, partial on rows that ran in a
chunk. Adding a nullable column without a default rewrites nothing; the index is built
CONCURRENTLY (outside a transaction), so enqueues and claims go on meanwhile, and it
is empty until a chunk runs."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgjobs", "0010_enqueue_fair_key")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="chunk_run",
            field=models.UUIDField(
                blank=True,
                editable=False,
                help_text="the chunk run (one call of a chunk handler) its last outcome came from",
                null=True,
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("chunk_run__isnull", False)),
                fields=["chunk_run", "id"],
                name="pgjobs_job_chunk_run_idx",
            ),
        ),
    ]
