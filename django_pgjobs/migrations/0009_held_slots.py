"""Limit slots held by runs the queue has written off while their thread goes on
(timed out, cancelled, reclaimed): ``django_pgjobs_heldslot``, counted by the limited
claim beside the running rows. A new, small table; nothing on the jobs table changes,
so the fast-path claim and completion are untouched. Reversible.
"""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0008_workflows")]

    operations = [
        migrations.CreateModel(
            name="HeldSlot",
            fields=[
                ("pk", models.CompositePrimaryKey("job_id", "lease", serialize=False)),
                ("job_id", models.BigIntegerField()),
                ("lease", models.BigIntegerField()),
                ("worker", models.CharField(max_length=255)),
                ("queue", models.CharField(max_length=100)),
                ("concurrency_key", models.CharField(blank=True, max_length=255, null=True)),
                (
                    "since",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "ordering": ["since"],
            },
        ),
    ]
