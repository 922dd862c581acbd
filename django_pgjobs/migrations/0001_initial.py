import django.db.models.functions.datetime
from django.db import migrations, models

# Aggressive autovacuum for the jobs table. Every job is inserted once and updated
# at least twice (claim, complete), so the table produces dead tuples at about
# twice the job rate. PostgreSQL's defaults (vacuum when 20% of the table is dead,
# throttled by a cost limit of 200) let a busy queue bloat: the claim index then
# fills with dead entries and every claim scans past them. Vacuuming after 5% + 500
# dead rows, at five times the default I/O budget with a 2 ms pause, keeps dead
# tuples bounded and the partial claim index small. RESET restores the defaults.
AUTOVACUUM_PARAMETERS = (
    "autovacuum_vacuum_scale_factor = 0.05",
    "autovacuum_vacuum_threshold = 500",
    "autovacuum_vacuum_cost_limit = 1000",
    "autovacuum_vacuum_cost_delay = 2",
)
SET_AUTOVACUUM = "ALTER TABLE django_pgjobs_job SET ({})".format(", ".join(AUTOVACUUM_PARAMETERS))
RESET_AUTOVACUUM = "ALTER TABLE django_pgjobs_job RESET ({})".format(
    ", ".join(p.split(" = ")[0] for p in AUTOVACUUM_PARAMETERS)
)


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Worker",
            fields=[
                ("id", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("host", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                ("queues", models.JSONField(default=list)),
                ("concurrency", models.IntegerField()),
                (
                    "started_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "last_seen",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "ordering": ["-last_seen"],
            },
        ),
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=255)),
                ("queue", models.CharField(db_default="default", max_length=100)),
                (
                    "priority",
                    models.SmallIntegerField(
                        db_default=0, help_text="-100..100, higher runs first"
                    ),
                ),
                ("args", models.JSONField(db_default=models.Value([], models.JSONField()))),
                ("kwargs", models.JSONField(db_default=models.Value({}, models.JSONField()))),
                (
                    "status",
                    models.CharField(
                        choices=[
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
                (
                    "run_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("heartbeat_at", models.DateTimeField(blank=True, null=True)),
                ("attempts", models.IntegerField(db_default=0)),
                ("max_attempts", models.IntegerField(db_default=5)),
                (
                    "lease",
                    models.BigIntegerField(
                        db_default=0, help_text="fencing token, bumped on every claim"
                    ),
                ),
                ("worker", models.CharField(blank=True, max_length=255, null=True)),
                ("idempotency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("errors", models.JSONField(db_default=models.Value([], models.JSONField()))),
                ("last_error", models.TextField(blank=True, null=True)),
            ],
            options={
                "ordering": ["-id"],
                "indexes": [
                    models.Index(
                        models.F("queue"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("run_at"),
                        models.F("id"),
                        condition=models.Q(("status", "pending")),
                        name="pgjobs_job_claim_idx",
                    ),
                    models.Index(
                        condition=models.Q(("status", "running")),
                        fields=["heartbeat_at"],
                        name="pgjobs_job_running_idx",
                    ),
                    models.Index(
                        condition=models.Q(("finished_at__isnull", False)),
                        fields=["finished_at"],
                        name="pgjobs_job_finished_idx",
                    ),
                    models.Index(
                        condition=models.Q(
                            ("status__in", ["running", "cancelled", "completed", "dead"])
                        ),
                        fields=["status", "-id"],
                        name="pgjobs_job_status_idx",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("idempotency_key",),
                        name="pgjobs_job_idempotency_key_uniq",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
                        name="pgjobs_job_priority_range",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("status__in", ["pending", "running", "completed", "dead", "cancelled"])
                        ),
                        name="pgjobs_job_status_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                ("finished_at__isnull", False),
                                ("status__in", ["cancelled", "completed", "dead"]),
                            ),
                            models.Q(
                                ("finished_at__isnull", True),
                                ("status__in", ["pending", "running"]),
                            ),
                            _connector="OR",
                        ),
                        name="pgjobs_job_finished_iff_terminal",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("attempts__gte", 0),
                            ("max_attempts__gte", 1),
                            ("attempts__lte", models.F("max_attempts")),
                        ),
                        name="pgjobs_job_attempts_in_bounds",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="JobResult",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("idempotency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("value", models.JSONField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "ordering": ["-job_id"],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("idempotency_key",),
                        name="pgjobs_result_idempotency_key_uniq",
                    )
                ],
            },
        ),
        migrations.RunSQL(SET_AUTOVACUUM, reverse_sql=RESET_AUTOVACUUM),
    ]
