"""Durable jobs: the ``waiting`` status (the constraints that list statuses take it in;
a partial index finds the waiting rows by wake time, and the claim index, partial on
pending, never holds one), the two columns a parked job uses (``waiting_for``,
``wakes``) and the ``JobStep`` table.

The step's foreign key is made ``ON DELETE CASCADE`` in the database itself: the
pruner deletes finished jobs with plain SQL in batches, and their steps must go with
them in the same statement (Django's own cascade runs only for ORM deletes).
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

# The foreign key Django made (its name is generated), remade with ON DELETE CASCADE.
CASCADE_SQL = """
DO $$
DECLARE fk text;
BEGIN
    SELECT conname INTO fk FROM pg_constraint
     WHERE conrelid = 'django_pgjobs_jobstep'::regclass AND contype = 'f';
    EXECUTE format('ALTER TABLE django_pgjobs_jobstep DROP CONSTRAINT %I', fk);
    ALTER TABLE django_pgjobs_jobstep ADD CONSTRAINT pgjobs_jobstep_job_fk
        FOREIGN KEY (job_id) REFERENCES django_pgjobs_job (id) ON DELETE CASCADE;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0004_fair_keys"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobStep",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("seq", models.IntegerField()),
                ("name", models.CharField(max_length=255)),
                ("occurrence", models.IntegerField(db_default=0)),
                ("kind", models.CharField(max_length=16)),
                ("result", models.JSONField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "ordering": ["job_id", "seq"],
            },
        ),
        migrations.RemoveConstraint(
            model_name="job",
            name="pgjobs_job_unique_active_uniq",
        ),
        migrations.RemoveConstraint(
            model_name="job",
            name="pgjobs_job_status_valid",
        ),
        migrations.RemoveConstraint(
            model_name="job",
            name="pgjobs_job_finished_iff_terminal",
        ),
        migrations.AddField(
            model_name="job",
            name="waiting_for",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="wakes",
            field=models.BigIntegerField(db_default=0, editable=False),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("blocked", "Blocked"),
                    ("waiting", "Waiting"),
                    ("pending", "Pending"),
                    ("running", "Running"),
                    ("completed", "Completed"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                ],
                db_default="pending",
                max_length=16,
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["run_at"],
                name="pgjobs_job_waiting_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("status__in", ["blocked", "pending", "running", "waiting"]),
                    ("unique_key__isnull", False),
                ),
                fields=("unique_key",),
                name="pgjobs_job_unique_active_uniq",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "status__in",
                        [
                            "blocked",
                            "waiting",
                            "pending",
                            "running",
                            "completed",
                            "dead",
                            "cancelled",
                        ],
                    )
                ),
                name="pgjobs_job_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("finished_at__isnull", False),
                        ("status__in", ["cancelled", "completed", "dead"]),
                    ),
                    models.Q(
                        ("finished_at__isnull", True),
                        ("status__in", ["blocked", "pending", "running", "waiting"]),
                    ),
                    _connector="OR",
                ),
                name="pgjobs_job_finished_iff_terminal",
            ),
        ),
        migrations.AddField(
            model_name="jobstep",
            name="job",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="steps",
                to="django_pgjobs.job",
            ),
        ),
        migrations.RunSQL(CASCADE_SQL, reverse_sql=migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="jobstep",
            constraint=models.UniqueConstraint(
                fields=("job", "name", "occurrence"), name="pgjobs_jobstep_name_uniq"
            ),
        ),
        migrations.AddConstraint(
            model_name="jobstep",
            constraint=models.UniqueConstraint(
                fields=("job", "seq"), name="pgjobs_jobstep_seq_uniq"
            ),
        ),
        migrations.AddConstraint(
            model_name="jobstep",
            constraint=models.CheckConstraint(
                condition=models.Q(("occurrence__gte", 0), ("seq__gte", 0)),
                name="pgjobs_jobstep_seq_positive",
            ),
        ),
    ]
