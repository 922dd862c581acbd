"""No foreign key onto the jobs table: a durable job's steps and its signals keep a
plain ``job_id`` (the unique keys of the steps and a new index of the signals find a
job's rows), and the pruner's statement deletes them with their job.

A foreign key's check takes ``FOR KEY SHARE`` on the job's row at every step or signal
insert, beside the worker's heartbeat and outcome updates of that same running row:
the multixact pattern the jobs table is kept free of (see "No foreign key to the job
row" in ``docs/explanation/postgres-pitfalls.md``). Django's own cascade still deletes
them along with a job deleted through the ORM (the admin's delete).

The drop takes the jobs table's lock for a moment (no scan); the new index is built
on the signals table only.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

DROP_SQL = """
ALTER TABLE django_pgjobs_jobstep DROP CONSTRAINT IF EXISTS pgjobs_jobstep_job_fk;
ALTER TABLE django_pgjobs_jobsignal DROP CONSTRAINT IF EXISTS pgjobs_signal_job_fk;
"""

# Back to the keys of 0005 and 0006 (a row whose job is gone would fail the re-add).
RESTORE_SQL = """
ALTER TABLE django_pgjobs_jobstep ADD CONSTRAINT pgjobs_jobstep_job_fk
    FOREIGN KEY (job_id) REFERENCES django_pgjobs_job (id) ON DELETE CASCADE;
ALTER TABLE django_pgjobs_jobsignal ADD CONSTRAINT pgjobs_signal_job_fk
    FOREIGN KEY (job_id) REFERENCES django_pgjobs_job (id) ON DELETE CASCADE;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0008_waiting_for_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(DROP_SQL, reverse_sql=RESTORE_SQL)],
            state_operations=[
                migrations.AlterField(
                    model_name="jobsignal",
                    name="job",
                    field=models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="signals",
                        to="django_pgjobs.job",
                    ),
                ),
                migrations.AlterField(
                    model_name="jobstep",
                    name="job",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="steps",
                        to="django_pgjobs.job",
                    ),
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="jobsignal",
            index=models.Index(fields=["job"], name="pgjobs_signal_job_idx"),
        ),
    ]
