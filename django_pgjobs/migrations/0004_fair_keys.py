"""Fair shares: a job's fair key, the fair claim's index over keyed pending jobs, and a
queue's weights. The index is built CONCURRENTLY (outside a transaction), so enqueues
and claims go on while it is built; it is partial on keyed jobs, empty until a task
declares a fair key."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgjobs", "0003_worker_degraded")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="fair_key",
            field=models.CharField(
                blank=True,
                help_text="the key whose jobs share the queue's claims fairly with other keys",
                max_length=255,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="weights",
            field=models.JSONField(
                blank=True,
                help_text='weights of fair keys, e.g. {"tenant:1": 3} (a key not named weighs 1)',
                null=True,
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("fair_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                models.F("id"),
                condition=models.Q(("fair_key__isnull", False), ("status", "pending")),
                name="pgjobs_job_fair_idx",
            ),
        ),
    ]
