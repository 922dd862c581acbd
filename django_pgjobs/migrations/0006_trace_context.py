"""Job.trace_context: the W3C trace context of the enqueue (OpenTelemetry), or NULL.

Adding a nullable column without a default is a catalog-only change in
PostgreSQL: no table rewrite, a brief ACCESS EXCLUSIVE lock only.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0005_flow_control")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
    ]
