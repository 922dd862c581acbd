"""A worker row says why its worker runs without its heartbeat process (empty while
it has one): ``jobs_status`` and the admin show it. A database default, so a worker
of the previous release, whose upsert does not name the column, registers too."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0002_workflow_trigger_retry_order")]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="degraded",
            field=models.TextField(blank=True, default="", db_default=""),
        ),
    ]
