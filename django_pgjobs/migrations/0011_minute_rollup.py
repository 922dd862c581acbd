"""The rollup: ``django_pgjobs_minute``, jobs finished per minute, queue and
status, and ``django_pgjobs_rollupmark``, the one row saying how far it has counted
(the first rollup pass of a worker writes it). Two new, small tables; nothing on the jobs
table changes, so no lock on it. Reversible.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0010_suspects"),
    ]

    operations = [
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
            options={
                "ordering": ["minute", "queue", "status"],
            },
        ),
        migrations.CreateModel(
            name="RollupMark",
            fields=[
                ("id", models.SmallIntegerField(primary_key=True, serialize=False)),
                ("rolled_from", models.DateTimeField(blank=True, null=True)),
                ("rolled_to", models.DateTimeField(blank=True, null=True)),
            ],
        ),
    ]
