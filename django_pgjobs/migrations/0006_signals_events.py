"""Signals to a job and events by name and key (``send_signal``, ``emit_event``).

A signal's job is a foreign key the database enforces with ON DELETE CASCADE, declared
here in SQL: the pruner deletes jobs with a statement of its own, and a job's signals go
with it (Django's own cascade would only run for ORM deletes).
"""

from __future__ import annotations

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0005_durable_jobs"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobEvent",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=255)),
                ("key", models.CharField(blank=True, max_length=255, null=True)),
                ("payload", models.JSONField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "ordering": ["id"],
                "indexes": [
                    models.Index(
                        fields=["name", "key", "created_at"], name="pgjobs_event_lookup_idx"
                    ),
                    models.Index(fields=["created_at"], name="pgjobs_event_created_idx"),
                ],
            },
        ),
        migrations.CreateModel(
            name="JobSignal",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=255)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("idempotency_key", models.CharField(blank=True, max_length=255, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("consumed_at", models.DateTimeField(blank=True, null=True)),
                ("consumed_by", models.CharField(blank=True, max_length=300, null=True)),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="signals",
                        to="django_pgjobs.job",
                    ),
                ),
            ],
            options={
                "ordering": ["id"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("consumed_at__isnull", True)),
                        fields=["job", "name", "id"],
                        name="pgjobs_signal_unconsumed_idx",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("job", "idempotency_key"),
                        name="pgjobs_signal_key_uniq",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("consumed_at__isnull", True),
                            ("consumed_by__isnull", False),
                            _connector="OR",
                        ),
                        name="pgjobs_signal_consumed_by_a_step",
                    ),
                ],
            },
        ),
        migrations.RunSQL(
            sql=(
                "ALTER TABLE django_pgjobs_jobsignal ADD CONSTRAINT pgjobs_signal_job_fk "
                "FOREIGN KEY (job_id) REFERENCES django_pgjobs_job (id) ON DELETE CASCADE"
            ),
            reverse_sql="ALTER TABLE django_pgjobs_jobsignal DROP CONSTRAINT pgjobs_signal_job_fk",
        ),
    ]
