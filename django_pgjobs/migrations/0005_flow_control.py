"""Flow control: queues as rows (pause, max_running, rate), per-key
concurrency and unique-while-active columns on jobs, and the tasks each worker
knows (deploy skew). Reversible: every operation is a plain schema change.

The new job columns are NULL for ordinary jobs, and the one new index on the jobs
table is partial on ``unique_key IS NOT NULL``, so enqueueing, claiming and
completing an ordinary job maintain no extra index entry.
"""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0004_job_timeout")]

    operations = [
        migrations.CreateModel(
            name="KnownTask",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                (
                    "last_known",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused", models.BooleanField(db_default=False, default=False)),
                (
                    "max_running",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="jobs of this queue running at once, across all workers",
                        null=True,
                    ),
                ),
                (
                    "rate",
                    models.CharField(
                        blank=True,
                        help_text='job starts per period across all workers: "N/s", "N/m" or "N/h"',
                        max_length=20,
                        null=True,
                    ),
                ),
                (
                    "rate_log",
                    models.JSONField(
                        blank=True,
                        db_default=models.Value([], models.JSONField()),
                        default=list,
                        editable=False,
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "ordering": ["name"],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_limit",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.CharField(blank=True, max_length=600, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="tasks",
            field=models.JSONField(
                blank=True, db_default=models.Value([], models.JSONField()), default=list
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("status__in", ["pending", "running"]), ("unique_key__isnull", False)
                ),
                fields=("unique_key",),
                name="pgjobs_job_unique_active_uniq",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("concurrency_key__isnull", True), ("concurrency_limit__isnull", True)
                    ),
                    models.Q(("concurrency_key__isnull", False), ("concurrency_limit__gte", 1)),
                    _connector="OR",
                ),
                name="pgjobs_job_concurrency_key_limit",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("max_running__gte", 1), ("max_running__isnull", True), _connector="OR"
                ),
                name="pgjobs_queue_max_running_positive",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("rate__regex", "^[1-9][0-9]{0,8}/[smh]$"),
                    ("rate__isnull", True),
                    _connector="OR",
                ),
                name="pgjobs_queue_rate_format",
            ),
        ),
    ]
