"""``Job.suspect``: set by the reaper on the jobs of a lost worker, which then run
alone in a child process until one of their runs ends normally. A boolean with a
constant default: PostgreSQL adds it without rewriting the table, and no index
changes, so the claim's plan is untouched. Reversible.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0009_held_slots")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="suspect",
            field=models.BooleanField(
                db_default=False,
                editable=False,
                help_text="reclaimed from a lost worker: runs alone in a child process until a run ends normally",
            ),
        ),
    ]
