"""Debounced jobs: the bound of each one's delay (``debounce_until``; NULL for a job
that is not debounced, so an enqueue of the previous release, which does not name the
column, writes what it always did), and ``pgjobs_enqueue`` with the debounce
arguments. The function's new arguments come last with defaults, so a call of the
old eight arguments (pg_cron's schedules, a trigger) means what it meant; the old
signature is dropped first, or the two would make such a call ambiguous."""

from __future__ import annotations

from django.db import migrations, models

from django_pgjobs.db.functions import ENQUEUE_FUNCTION

OLD_SIGNATURE = "pgjobs_enqueue(text, jsonb, jsonb, text, integer, timestamptz, text, integer)"


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0006_signals_events")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="debounce_until",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        # Going back keeps the function: its calls without the debounce arguments never
        # name the column; the squashed migration's reverse drops both signatures.
        migrations.RunSQL(
            [f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE}", ENQUEUE_FUNCTION],
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
