"""The SQL function pgjobs_enqueue(task, args, kwargs, queue, priority, run_at,
idempotency_key, max_attempts): enqueue from pg_cron schedules, triggers or psql.

It writes the same columns as the Python enqueue (a NULL argument falls back to
the column's default), validates its input, and sends the same wake-up NOTIFY.
"""

from django.db import migrations

from django_pgjobs.sql import ENQUEUE_FUNCTION, ENQUEUE_FUNCTION_DROP


class Migration(migrations.Migration):

    dependencies = [
        ("django_pgjobs", "0001_initial"),
    ]

    operations = [
        # Lists: executed as single statements (no script splitting inside the $fn$ body).
        migrations.RunSQL([ENQUEUE_FUNCTION], reverse_sql=[ENQUEUE_FUNCTION_DROP]),
    ]
