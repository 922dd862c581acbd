"""``pgjobs_enqueue`` with a fair key: a job enqueued from SQL into a fair queue can
name the key whose turn it takes in the fair claim's rotation, as
``@job(fair_key=...)`` stores it. The argument comes last with a default, so a call of
the older arguments (pg_cron's schedules, a trigger) means what it meant; the old
signature is dropped first, or the two would make such a call ambiguous."""

from __future__ import annotations

from django.db import migrations

from django_pgjobs.db.functions import ENQUEUE_FUNCTION

OLD_SIGNATURE = (
    "pgjobs_enqueue(text, jsonb, jsonb, text, integer, timestamptz, text, integer,"
    " interval, text, interval, text)"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0009_no_job_foreign_keys")]

    operations = [
        # Going back keeps the function: a call without fair_key writes no key, as the
        # older one did; the squashed migration's reverse drops every signature.
        migrations.RunSQL(
            [f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE}", ENQUEUE_FUNCTION],
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
