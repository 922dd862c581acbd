"""``.using(timeout=None)`` is stored as Infinity (no limit) and an empty timeout
means "not given per call" (the ``@job``'s limit or ``PGJOBS["DEFAULT_TIMEOUT"]``
applies): the help text says so. No change to the table."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0014_workflow_trigger_v4")]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="timeout",
            field=models.FloatField(
                blank=True,
                null=True,
                help_text="seconds a run may take, given per call (empty: the @job's limit "
                "or the default; Infinity: no limit)",
            ),
        ),
    ]
