"""Per-job timeouts (``@job(timeout=...)``): the limit travels with the row, so a
worker enforces what the enqueuer asked for, whatever its own code says."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0003_enqueue_function_v2")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="timeout",
            field=models.FloatField(
                blank=True, null=True, help_text="seconds a run may take (empty: no limit)"
            ),
        ),
    ]
