"""The workflow trigger again, for the retry rule: a retried parent puts back to
``blocked`` each of its children that is ``pending`` (released while the parent was
dead or cancelled, not claimed yet), not only one retried by the same statement, so a
child waits for its retried parent whatever order the two were retried in.

Runs the functions' one text (``CREATE OR REPLACE``, same signatures; the trigger
dropped and created again); no table changes. Its reverse does nothing: the squashed
migration keeps no older text to go back to.
"""

from django.db import migrations

from django_pgjobs.db.workflow_trigger import WORKFLOW_FUNCTIONS


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0001_squashed_0015_job_timeout_no_limit")]

    operations = [
        migrations.RunSQL([WORKFLOW_FUNCTIONS], reverse_sql=migrations.RunSQL.noop),
    ]
