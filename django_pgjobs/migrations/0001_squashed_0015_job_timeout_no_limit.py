"""The schema of django-pgjobs, in one migration: its tables, indexes and constraints,
the jobs table's autovacuum parameters, and the SQL functions and the workflow trigger.

It replaces migrations 0001-0015: Django marks it applied on a database that has all
of them (and runs nothing), and runs it on an empty one. How to upgrade a database
that has only some of them: docs/howto/upgrade.md.

The SQL functions come from their one text in ``django_pgjobs.db``, so a fresh
database gets what the code runs against. Each statement replaces what it creates
(``CREATE OR REPLACE``, ``DROP TRIGGER IF EXISTS``): a later migration that changes a
function imports the same text and runs it again (``RunSQL([WORKFLOW_FUNCTIONS],
reverse_sql=migrations.RunSQL.noop)``; no older text is kept to go back to).
"""

from django.db import migrations, models
from django.db.models.functions import Now

from django_pgjobs.db.functions import ENQUEUE_FUNCTION
from django_pgjobs.db.workflow_trigger import WORKFLOW_FUNCTIONS, WORKFLOW_FUNCTIONS_DROP

# Autovacuum for the jobs table: every job is inserted once and updated at least twice
# (claim, complete), so its dead tuples grow at about twice the job rate; PostgreSQL's
# defaults (20% dead, cost limit 200) let a busy queue bloat and every claim then scans
# past dead index entries. After 5% + 500 dead rows, at five times the default I/O
# budget with a 2 ms pause, dead tuples stay bounded and the claim index small.
SET_AUTOVACUUM = (
    "ALTER TABLE django_pgjobs_job SET (autovacuum_vacuum_scale_factor = 0.05,"
    " autovacuum_vacuum_threshold = 500, autovacuum_vacuum_cost_limit = 1000,"
    " autovacuum_vacuum_cost_delay = 2)"
)
RESET_AUTOVACUUM = (
    "ALTER TABLE django_pgjobs_job RESET (autovacuum_vacuum_scale_factor,"
    " autovacuum_vacuum_threshold, autovacuum_vacuum_cost_limit, autovacuum_vacuum_cost_delay)"
)
# Every signature: 0007 adds the debounce arguments and 0010 the fair key, and their
# reverses keep the function (a call of the older arguments means the same with the
# newer ones defaulted).
ENQUEUE_FUNCTION_DROP = (
    "DROP FUNCTION IF EXISTS pgjobs_enqueue(text, jsonb, jsonb, text, integer, timestamptz, text, integer),"
    " pgjobs_enqueue(text, jsonb, jsonb, text, integer, timestamptz, text, integer, interval, text, interval, text),"
    " pgjobs_enqueue(text, jsonb, jsonb, text, integer, timestamptz, text, integer, interval, text, interval, text,"
    " text)"
)


class Migration(migrations.Migration):
    replaces = [
        ("django_pgjobs", "0001_initial"),
        ("django_pgjobs", "0002_pgjobs_enqueue"),
        ("django_pgjobs", "0003_enqueue_function_v2"),
        ("django_pgjobs", "0004_job_timeout"),
        ("django_pgjobs", "0005_flow_control"),
        ("django_pgjobs", "0006_trace_context"),
        ("django_pgjobs", "0007_status_index_without_running"),
        ("django_pgjobs", "0008_workflows"),
        ("django_pgjobs", "0009_held_slots"),
        ("django_pgjobs", "0010_suspects"),
        ("django_pgjobs", "0011_minute_rollup"),
        ("django_pgjobs", "0012_workflow_trigger_v2"),
        ("django_pgjobs", "0013_workflow_trigger_v3"),
        ("django_pgjobs", "0014_workflow_trigger_v4"),
        ("django_pgjobs", "0015_job_timeout_no_limit"),
    ]

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
                ("started_at", models.DateTimeField(db_default=Now())),
                ("last_seen", models.DateTimeField(db_default=Now())),
                (
                    "tasks",
                    models.JSONField(
                        blank=True, db_default=models.Value([], models.JSONField()), default=list
                    ),
                ),
            ],
            options={"ordering": ["-last_seen"]},
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
                            ("blocked", "Blocked"),
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
                ("run_at", models.DateTimeField(db_default=Now())),
                ("created_at", models.DateTimeField(db_default=Now())),
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
                (
                    "timeout",
                    models.FloatField(
                        blank=True,
                        help_text="seconds a run may take, given per call (empty: the @job's limit or the default; Infinity: no limit)",
                        null=True,
                    ),
                ),
                ("concurrency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("concurrency_limit", models.PositiveSmallIntegerField(blank=True, null=True)),
                ("unique_key", models.CharField(blank=True, max_length=600, null=True)),
                ("trace_context", models.JSONField(blank=True, editable=False, null=True)),
                ("workflow_id", models.BigIntegerField(blank=True, editable=False, null=True)),
                ("node", models.CharField(blank=True, editable=False, max_length=255, null=True)),
                ("waiting", models.IntegerField(blank=True, editable=False, null=True)),
                ("failed_parents", models.IntegerField(blank=True, editable=False, null=True)),
                ("cancelled_by", models.BigIntegerField(blank=True, editable=False, null=True)),
                (
                    "suspect",
                    models.BooleanField(
                        db_default=False,
                        editable=False,
                        help_text="reclaimed from a lost worker: runs alone in a child process until a run ends normally",
                    ),
                ),
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
                        condition=models.Q(("status__in", ["cancelled", "completed", "dead"])),
                        fields=["status", "-id"],
                        name="pgjobs_job_status_idx",
                    ),
                    models.Index(
                        condition=models.Q(("workflow_id__isnull", False)),
                        fields=["workflow_id", "id"],
                        name="pgjobs_job_workflow_idx",
                    ),
                    models.Index(
                        condition=models.Q(("status", "blocked")),
                        fields=["queue", "id"],
                        name="pgjobs_job_blocked_idx",
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
                            ("attempts__gte", 0),
                            ("max_attempts__gte", 1),
                            ("attempts__lte", models.F("max_attempts")),
                        ),
                        name="pgjobs_job_attempts_in_bounds",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                ("concurrency_key__isnull", True),
                                ("concurrency_limit__isnull", True),
                            ),
                            models.Q(
                                ("concurrency_key__isnull", False), ("concurrency_limit__gte", 1)
                            ),
                            _connector="OR",
                        ),
                        name="pgjobs_job_concurrency_key_limit",
                    ),
                    models.UniqueConstraint(
                        condition=models.Q(
                            ("status__in", ["blocked", "pending", "running"]),
                            ("unique_key__isnull", False),
                        ),
                        fields=("unique_key",),
                        name="pgjobs_job_unique_active_uniq",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                ["blocked", "pending", "running", "completed", "dead", "cancelled"],
                            )
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
                                ("status__in", ["blocked", "pending", "running"]),
                            ),
                            _connector="OR",
                        ),
                        name="pgjobs_job_finished_iff_terminal",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("status", "blocked"), _negated=True),
                            models.Q(("waiting__gte", 1), ("waiting__isnull", False)),
                            _connector="OR",
                        ),
                        name="pgjobs_job_blocked_waits",
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
                ("created_at", models.DateTimeField(db_default=Now())),
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
        migrations.CreateModel(
            name="KnownTask",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("last_known", models.DateTimeField(db_default=Now())),
            ],
            options={"ordering": ["name"]},
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
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("max_running__gte", 1), ("max_running__isnull", True), _connector="OR"
                        ),
                        name="pgjobs_queue_max_running_positive",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("rate__regex", "^[1-9][0-9]{0,8}/[smh]$"),
                            ("rate__isnull", True),
                            _connector="OR",
                        ),
                        name="pgjobs_queue_rate_format",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "child_id",
                        "position",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("child_id", models.BigIntegerField()),
                ("position", models.IntegerField()),
                ("parent_id", models.BigIntegerField()),
                ("parent_node", models.CharField(blank=True, max_length=255, null=True)),
                ("on_parent_failure", models.CharField(db_default="cancel", max_length=8)),
                ("receives", models.CharField(db_default="none", max_length=8)),
            ],
            options={
                "ordering": ["child_id", "position"],
                "indexes": [
                    models.Index(fields=["parent_id", "child_id"], name="pgjobs_dep_parent_idx")
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("on_parent_failure__in", ["cancel", "run"])),
                        name="pgjobs_dep_on_parent_failure_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("receives__in", ["none", "first", "list"])),
                        name="pgjobs_dep_receives_valid",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=255)),
                ("kind", models.CharField(max_length=16)),
                ("created_at", models.DateTimeField(db_default=Now())),
                ("cancelled_at", models.DateTimeField(blank=True, null=True)),
                ("closed_at", models.DateTimeField(blank=True, null=True)),
                ("members", models.IntegerField(blank=True, null=True)),
                ("completed", models.IntegerField(db_default=0)),
                ("dead", models.IntegerField(db_default=0)),
                ("cancelled", models.IntegerField(db_default=0)),
                ("fired_at", models.DateTimeField(blank=True, null=True)),
                ("callbacks", models.JSONField(db_default=models.Value([], models.JSONField()))),
            ],
            options={
                "ordering": ["-id"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("fired_at__isnull", True), ("kind", "batch")),
                        fields=["id"],
                        name="pgjobs_workflow_unfired_idx",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("kind__in", ["workflow", "chain", "group", "chord", "batch"])
                        ),
                        name="pgjobs_workflow_kind_valid",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="HeldSlot",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id",
                        "lease",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("job_id", models.BigIntegerField()),
                ("lease", models.BigIntegerField()),
                ("worker", models.CharField(max_length=255)),
                ("queue", models.CharField(max_length=100)),
                ("concurrency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("since", models.DateTimeField(db_default=Now())),
            ],
            options={"ordering": ["since"]},
        ),
        migrations.CreateModel(
            name="Minute",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "minute",
                        "queue",
                        "status",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("minute", models.DateTimeField()),
                ("queue", models.CharField(max_length=100)),
                ("status", models.CharField(max_length=20)),
                ("finished", models.BigIntegerField(db_default=0)),
                ("waited_since", models.DateTimeField(blank=True, null=True)),
            ],
            options={"ordering": ["minute", "queue", "status"]},
        ),
        migrations.CreateModel(
            name="RollupMark",
            fields=[
                ("id", models.SmallIntegerField(primary_key=True, serialize=False)),
                ("rolled_from", models.DateTimeField(blank=True, null=True)),
                ("rolled_to", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.RunSQL(SET_AUTOVACUUM, reverse_sql=RESET_AUTOVACUUM),
        # Lists: each runs as one statement (no script splitting inside a $fn$ body).
        migrations.RunSQL([ENQUEUE_FUNCTION], reverse_sql=[ENQUEUE_FUNCTION_DROP]),
        migrations.RunSQL([WORKFLOW_FUNCTIONS], reverse_sql=[WORKFLOW_FUNCTIONS_DROP]),
    ]
