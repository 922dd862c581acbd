"""Workflows and batches: the ``blocked`` status, the workflow and
dependency tables, the workflow columns of jobs, and the trigger that releases a
blocked job in the transaction that finishes its last parent.

Careful with the big jobs table:

* the new job columns are NULL, no default: adding them rewrites nothing;
* the changed CHECK constraints are added ``NOT VALID`` (a brief lock, no scan) and
  validated in a later statement, which scans without blocking writers; this
  migration is therefore non-atomic (each statement commits on its own);
* the new indexes, and the unique_while index that now includes blocked jobs, are
  built ``CONCURRENTLY``; the new unique index is built beside the old one and the
  two swap names, so a key is never unguarded.

Frozen: ``WORKFLOW_FUNCTIONS_V1`` is the SQL text this migration runs, whatever
later code says (``tests/test_migrations_frozen.py`` keeps the newest migration's
copy equal to ``db.workflow_trigger.WORKFLOW_FUNCTIONS``).
"""

import django.db.models.functions.datetime
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

JOB = "django_pgjobs_job"

WORKFLOW_FUNCTIONS_V1 = r"""
DO $do$
DECLARE
    schema_name text := (SELECT n.nspname FROM pg_class c
                           JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE c.oid = 'django_pgjobs_job'::regclass);
BEGIN
EXECUTE replace($s0$
CREATE OR REPLACE FUNCTION @SCHEMA@.pgjobs_batch_fire(batches bigint[]) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    woken text[];
    n integer;
BEGIN
    WITH fired AS (
        UPDATE @SCHEMA@.django_pgjobs_workflow w SET fired_at = now()
         WHERE w.id = ANY (batches) AND w.kind = 'batch' AND w.fired_at IS NULL
           AND w.closed_at IS NOT NULL AND w.completed + w.dead + w.cancelled >= w.members
        RETURNING w.id, w.completed, w.dead, w.cancelled, w.callbacks
    ), cb AS (
        SELECT f.id AS batch, x.id, x."when", x.pass,
               jsonb_build_object('completed', f.completed, 'dead', f.dead,
                                  'cancelled', f.cancelled) AS counts,
               x."when" = 'complete' OR (x."when" = 'success') = (f.dead + f.cancelled = 0) AS runs
          FROM fired f
         CROSS JOIN LATERAL jsonb_to_recordset(f.callbacks) AS x(id bigint, "when" text, pass boolean)
    ), moved AS (
        UPDATE @SCHEMA@.django_pgjobs_job c
           SET waiting = 0,
               status = CASE WHEN cb.runs THEN 'pending' ELSE 'cancelled' END,
               run_at = greatest(c.run_at, now()),
               finished_at = CASE WHEN cb.runs THEN NULL ELSE now() END,
               args = CASE WHEN cb.runs AND cb.pass THEN jsonb_build_array(cb.counts) || c.args
                           ELSE c.args END,
               last_error = CASE WHEN cb.runs THEN c.last_error
                                 ELSE format('not run: batch #%s finished with %s', cb.batch, cb.counts)
                            END
          FROM cb
         WHERE c.id = cb.id AND c.status = 'blocked'
        RETURNING c.queue, c.status
    )
    SELECT array_agg(DISTINCT m.queue) FILTER (WHERE m.status = 'pending'), count(*)
      INTO woken, n FROM moved m;
    PERFORM pg_notify('pgjobs', q) FROM unnest(woken) AS q;
    RETURN n;
END
$fn$
$s0$, '@SCHEMA@', quote_ident(schema_name));
EXECUTE replace($s1$
CREATE OR REPLACE FUNCTION @SCHEMA@.pgjobs_workflow_step(
    moved_ids bigint[], moved_wfs bigint[], moved_members boolean[], moved_olds text[],
    moved_news text[]
) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    done_ids bigint[];  -- parents that finished
    done_st text[];     -- ... and how
    back_ids bigint[];  -- parents that left a finished status (a retry)
    back_st text[];     -- ... and the finished status they left
    woken text[];       -- queues of released jobs
    due bigint[];       -- batches to fire
BEGIN
    PERFORM set_config('pgjobs.workflow_step', 'on', true);
    SELECT array_agg(c.id ORDER BY c.id), array_agg(c.new ORDER BY c.id)
      INTO done_ids, done_st
      FROM unnest(moved_ids, moved_olds, moved_news) AS c(id, old, new)
     WHERE c.new IN ('completed', 'dead', 'cancelled');
    SELECT array_agg(c.id ORDER BY c.id), array_agg(c.old ORDER BY c.id)
      INTO back_ids, back_st
      FROM unnest(moved_ids, moved_olds, moved_news) AS c(id, old, new)
     WHERE c.old IN ('completed', 'dead', 'cancelled');

    -- 1. Finished parents: each child's counters go down; a blocked child is
    -- released at zero, or cancelled by a parent that ended dead or cancelled,
    -- which is passed on to its own children in the next turn.
    WHILE done_ids IS NOT NULL LOOP
        -- Lock the children in id order; the next statement's snapshot then sees
        -- every parent finished by a transaction that held these locks before us.
        PERFORM 1 FROM @SCHEMA@.django_pgjobs_job c
         WHERE c.id IN (SELECT e.child_id FROM @SCHEMA@.django_pgjobs_jobdependency e
                         WHERE e.parent_id = ANY (done_ids))
           AND c.status IN ('blocked', 'cancelled')
         ORDER BY c.id
           FOR NO KEY UPDATE OF c;
        WITH p AS (
            SELECT * FROM unnest(done_ids, done_st) AS p(id, status)
        ), agg AS (
            SELECT e.child_id AS id, count(*)::int AS done,
                   count(*) FILTER (WHERE p.status <> 'completed')::int AS failed,
                   min(p.id) FILTER (WHERE p.status <> 'completed') AS culprit,
                   bool_or(e.on_parent_failure = 'cancel') AS cancel_on_failure,
                   (array_agg(format('%s%s ended %s', p.id,
                                     COALESCE(' (' || e.parent_node || ')', ''), p.status)
                              ORDER BY p.id) FILTER (WHERE p.status <> 'completed'))[1] AS why
              FROM @SCHEMA@.django_pgjobs_jobdependency e JOIN p ON p.id = e.parent_id
             -- by the edges' parent index (the join alone may hash the whole table)
             WHERE e.parent_id = ANY (done_ids)
             GROUP BY e.child_id
        ), decided AS (
            SELECT agg.*, c.status AS was,
                   CASE WHEN c.status <> 'blocked' THEN c.status
                        WHEN agg.failed > 0 AND agg.cancel_on_failure THEN 'cancelled'
                        WHEN c.waiting - agg.done > 0 THEN 'blocked'
                        ELSE 'pending' END AS becomes
              FROM agg JOIN @SCHEMA@.django_pgjobs_job c ON c.id = agg.id
             WHERE c.status IN ('blocked', 'cancelled')
        ), moved AS (
            UPDATE @SCHEMA@.django_pgjobs_job c
               SET waiting = greatest(c.waiting - d.done, 0),
                   failed_parents = COALESCE(c.failed_parents, 0) + d.failed,
                   status = d.becomes,
                   -- released: due now, or at its own run_at if that is later
                   run_at = CASE WHEN d.becomes = 'pending' THEN greatest(c.run_at, now())
                                 ELSE c.run_at END,
                   finished_at = CASE WHEN d.was = 'blocked' AND d.becomes = 'cancelled'
                                      THEN now() ELSE c.finished_at END,
                   cancelled_by = CASE WHEN d.was <> d.becomes AND d.becomes = 'cancelled'
                                       THEN d.culprit ELSE c.cancelled_by END,
                   last_error = CASE WHEN d.was <> d.becomes AND d.becomes = 'cancelled'
                                     THEN 'cancelled: its parent job #' || d.why
                                          || ' (on_parent_failure="cancel")'
                                     ELSE c.last_error END
              FROM decided d
             WHERE c.id = d.id
            RETURNING c.id, c.queue, d.was, d.becomes
        )
        -- the children it cancelled are the parents of the next turn
        SELECT array_agg(m.id ORDER BY m.id) FILTER (WHERE m.becomes <> m.was AND m.becomes = 'cancelled'),
               array_agg(m.becomes ORDER BY m.id) FILTER (WHERE m.becomes <> m.was AND m.becomes = 'cancelled'),
               array_agg(DISTINCT m.queue) FILTER (WHERE m.becomes = 'pending')
          INTO done_ids, done_st, woken
          FROM moved m;
        PERFORM pg_notify('pgjobs', q) FROM unnest(woken) AS q;
    END LOOP;

    -- 2. Retried parents: children they cancelled wait for them again (and pass
    -- it on to their own children); other children only count them again.
    WHILE back_ids IS NOT NULL LOOP
        PERFORM 1 FROM @SCHEMA@.django_pgjobs_job c
         WHERE c.id IN (SELECT e.child_id FROM @SCHEMA@.django_pgjobs_jobdependency e
                         WHERE e.parent_id = ANY (back_ids))
           AND c.status IN ('blocked', 'cancelled')
         ORDER BY c.id
           FOR NO KEY UPDATE OF c;
        WITH p AS (
            SELECT * FROM unnest(back_ids, back_st) AS p(id, status)
        ), agg AS (
            SELECT e.child_id AS id, count(*)::int AS back,
                   count(*) FILTER (WHERE p.status <> 'completed')::int AS unfailed
              FROM @SCHEMA@.django_pgjobs_jobdependency e JOIN p ON p.id = e.parent_id
             WHERE e.parent_id = ANY (back_ids)
             GROUP BY e.child_id
        ), decided AS (
            SELECT agg.*, c.status AS was,
                   CASE WHEN c.status = 'cancelled' AND c.cancelled_by IS NOT NULL
                             AND COALESCE(c.failed_parents, 0) - agg.unfailed <= 0
                        THEN 'blocked' ELSE c.status END AS becomes
              FROM agg JOIN @SCHEMA@.django_pgjobs_job c ON c.id = agg.id
             WHERE c.status IN ('blocked', 'cancelled')
        ), moved AS (
            UPDATE @SCHEMA@.django_pgjobs_job c
               SET waiting = c.waiting + d.back,
                   failed_parents = greatest(COALESCE(c.failed_parents, 0) - d.unfailed, 0),
                   status = d.becomes,
                   finished_at = CASE WHEN d.becomes = 'blocked' THEN NULL ELSE c.finished_at END,
                   cancelled_by = CASE WHEN d.becomes = 'blocked' THEN NULL ELSE c.cancelled_by END,
                   last_error = CASE WHEN d.was <> d.becomes THEN NULL ELSE c.last_error END
              FROM decided d
             WHERE c.id = d.id
            RETURNING c.id, d.was, d.becomes
        )
        -- the children it resumed are the retried parents of the next turn
        SELECT array_agg(m.id ORDER BY m.id), array_agg(m.was ORDER BY m.id)
          INTO back_ids, back_st
          FROM moved m WHERE m.was = 'cancelled' AND m.becomes = 'blocked';
    END LOOP;

    -- 3. Batch members: count each outcome on the batch's row (locked in id order);
    -- a closed batch whose members have all finished fires its callbacks.
    IF true = ANY (moved_members) THEN
        PERFORM 1 FROM @SCHEMA@.django_pgjobs_workflow w
         WHERE w.id IN (SELECT m.wf FROM unnest(moved_wfs, moved_members) AS m(wf, member) WHERE m.member)
           AND w.kind = 'batch'
         ORDER BY w.id
           FOR NO KEY UPDATE OF w;
        WITH m AS (
            SELECT * FROM unnest(moved_wfs, moved_members, moved_olds, moved_news) AS m(wf, member, old, new)
             WHERE m.member
        ), delta AS (
            SELECT m.wf,
                   count(*) FILTER (WHERE m.new = 'completed')
                     - count(*) FILTER (WHERE m.old = 'completed') AS completed,
                   count(*) FILTER (WHERE m.new = 'dead')
                     - count(*) FILTER (WHERE m.old = 'dead') AS dead,
                   count(*) FILTER (WHERE m.new = 'cancelled')
                     - count(*) FILTER (WHERE m.old = 'cancelled') AS cancelled
              FROM m GROUP BY m.wf
        ), counted AS (
            UPDATE @SCHEMA@.django_pgjobs_workflow w
               SET completed = w.completed + d.completed, dead = w.dead + d.dead,
                   cancelled = w.cancelled + d.cancelled
              FROM delta d
             WHERE w.id = d.wf AND w.kind = 'batch'
            RETURNING w.id, w.closed_at IS NOT NULL AND w.fired_at IS NULL
                            AND w.completed + w.dead + w.cancelled >= w.members AS due
        )
        SELECT array_agg(c.id ORDER BY c.id) FILTER (WHERE c.due) INTO due FROM counted c;
        IF due IS NOT NULL THEN
            PERFORM @SCHEMA@.pgjobs_batch_fire(due);
        END IF;
    END IF;
    PERFORM set_config('pgjobs.workflow_step', '', true);
END
$fn$
$s1$, '@SCHEMA@', quote_ident(schema_name));
EXECUTE replace($s2$
CREATE OR REPLACE FUNCTION @SCHEMA@.pgjobs_workflow_trigger() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    ids bigint[];
    wfs bigint[];
    members boolean[];
    olds text[];
    news text[];
BEGIN
    -- A plain statement (no workflow member among its rows) ends here.
    IF NOT EXISTS (SELECT 1 FROM pgjobs_new n WHERE n.workflow_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    IF current_setting('pgjobs.workflow_step', true) = 'on' THEN
        RETURN NULL;  -- the step's own writes: it handles their consequences itself
    END IF;
    -- Members that entered or left a finished status (in id order).
    SELECT array_agg(n.id ORDER BY n.id), array_agg(n.workflow_id ORDER BY n.id),
           array_agg(n.waiting IS NULL ORDER BY n.id),
           array_agg(o.status::text ORDER BY n.id), array_agg(n.status::text ORDER BY n.id)
      INTO ids, wfs, members, olds, news
      FROM pgjobs_new n JOIN pgjobs_old o ON o.id = n.id
     WHERE n.workflow_id IS NOT NULL
       AND (n.status IN ('completed', 'dead', 'cancelled')) <> (o.status IN ('completed', 'dead', 'cancelled'));
    IF ids IS NOT NULL THEN
        PERFORM @SCHEMA@.pgjobs_workflow_step(ids, wfs, members, olds, news);
    END IF;
    RETURN NULL;
END
$fn$
$s2$, '@SCHEMA@', quote_ident(schema_name));
EXECUTE replace($s3$DROP TRIGGER IF EXISTS pgjobs_workflow_step ON @SCHEMA@.django_pgjobs_job$s3$, '@SCHEMA@', quote_ident(schema_name));
EXECUTE replace($s4$
CREATE TRIGGER pgjobs_workflow_step AFTER UPDATE ON @SCHEMA@.django_pgjobs_job
REFERENCING OLD TABLE AS pgjobs_old NEW TABLE AS pgjobs_new
FOR EACH STATEMENT EXECUTE FUNCTION @SCHEMA@.pgjobs_workflow_trigger()
$s4$, '@SCHEMA@', quote_ident(schema_name));
END
$do$
"""

WORKFLOW_FUNCTIONS_DROP_V1 = r"""
DO $do$
DECLARE
    schema_name text := (SELECT n.nspname FROM pg_class c
                           JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE c.oid = 'django_pgjobs_job'::regclass);
BEGIN
EXECUTE replace($s0$DROP TRIGGER IF EXISTS pgjobs_workflow_step ON @SCHEMA@.django_pgjobs_job$s0$, '@SCHEMA@', quote_ident(schema_name));
EXECUTE replace($s1$DROP FUNCTION IF EXISTS @SCHEMA@.pgjobs_workflow_trigger()$s1$, '@SCHEMA@', quote_ident(schema_name));
EXECUTE replace($s2$DROP FUNCTION IF EXISTS @SCHEMA@.pgjobs_workflow_step(bigint[], bigint[], boolean[], text[], text[])$s2$, '@SCHEMA@', quote_ident(schema_name));
EXECUTE replace($s3$DROP FUNCTION IF EXISTS @SCHEMA@.pgjobs_batch_fire(bigint[])$s3$, '@SCHEMA@', quote_ident(schema_name));
END
$do$
"""


STATUSES_OLD = "('pending', 'running', 'completed', 'dead', 'cancelled')"
STATUSES_NEW = "('blocked', 'pending', 'running', 'completed', 'dead', 'cancelled')"
FINISHED_OLD = (
    """(("finished_at" IS NOT NULL AND "status" IN ('cancelled', 'completed', 'dead'))"""
    """ OR ("finished_at" IS NULL AND "status" IN ('pending', 'running')))"""
)
FINISHED_NEW = (
    """(("finished_at" IS NOT NULL AND "status" IN ('cancelled', 'completed', 'dead'))"""
    """ OR ("finished_at" IS NULL AND "status" IN ('blocked', 'pending', 'running')))"""
)


def _replace_check(name: str, old: str, new: str) -> migrations.RunSQL:
    """Swap a CHECK constraint of the jobs table without a long lock: drop and add
    NOT VALID in one statement (enforced for every write from then on), validate
    in the next (a scan that does not block writers)."""
    return migrations.RunSQL(
        [
            f'ALTER TABLE "{JOB}" DROP CONSTRAINT "{name}", '
            f'ADD CONSTRAINT "{name}" CHECK ({new}) NOT VALID',
            f'ALTER TABLE "{JOB}" VALIDATE CONSTRAINT "{name}"',
        ],
        reverse_sql=[
            f'ALTER TABLE "{JOB}" DROP CONSTRAINT "{name}", '
            f'ADD CONSTRAINT "{name}" CHECK ({old}) NOT VALID',
            f'ALTER TABLE "{JOB}" VALIDATE CONSTRAINT "{name}"',
        ],
    )


def _unique_active(statuses: str) -> tuple[str, ...]:
    """Rebuild pgjobs_job_unique_active_uniq for ``statuses``: the new index is built
    concurrently beside the old one, then they swap names and the old one goes."""
    return (
        'DROP INDEX CONCURRENTLY IF EXISTS "pgjobs_job_unique_active_uniq_next"',
        'CREATE UNIQUE INDEX CONCURRENTLY "pgjobs_job_unique_active_uniq_next" '
        f'ON "{JOB}" ("unique_key") WHERE ("status" IN {statuses} AND "unique_key" IS NOT NULL)',
        'ALTER INDEX "pgjobs_job_unique_active_uniq" RENAME TO "pgjobs_job_unique_active_uniq_prev"',
        'ALTER INDEX "pgjobs_job_unique_active_uniq_next" RENAME TO "pgjobs_job_unique_active_uniq"',
        'DROP INDEX CONCURRENTLY "pgjobs_job_unique_active_uniq_prev"',
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgjobs", "0007_status_index_without_running")]

    operations = [
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
            options={"ordering": ["child_id", "position"]},
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=255)),
                ("kind", models.CharField(max_length=16)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("cancelled_at", models.DateTimeField(blank=True, null=True)),
                ("closed_at", models.DateTimeField(blank=True, null=True)),
                ("members", models.IntegerField(blank=True, null=True)),
                ("completed", models.IntegerField(db_default=0)),
                ("dead", models.IntegerField(db_default=0)),
                ("cancelled", models.IntegerField(db_default=0)),
                ("fired_at", models.DateTimeField(blank=True, null=True)),
                ("callbacks", models.JSONField(db_default=models.Value([], models.JSONField()))),
            ],
            options={"ordering": ["-id"]},
        ),
        migrations.AddIndex(
            model_name="jobdependency",
            index=models.Index(fields=["parent_id", "child_id"], name="pgjobs_dep_parent_idx"),
        ),
        migrations.AddConstraint(
            model_name="jobdependency",
            constraint=models.CheckConstraint(
                condition=models.Q(("on_parent_failure__in", ["cancel", "run"])),
                name="pgjobs_dep_on_parent_failure_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="jobdependency",
            constraint=models.CheckConstraint(
                condition=models.Q(("receives__in", ["none", "first", "list"])),
                name="pgjobs_dep_receives_valid",
            ),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(
                condition=models.Q(("fired_at__isnull", True), ("kind", "batch")),
                fields=["id"],
                name="pgjobs_workflow_unfired_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="workflow",
            constraint=models.CheckConstraint(
                condition=models.Q(("kind__in", ["workflow", "chain", "group", "chord", "batch"])),
                name="pgjobs_workflow_kind_valid",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="workflow_id",
            field=models.BigIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="node",
            field=models.CharField(blank=True, editable=False, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="waiting",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="failed_parents",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="cancelled_by",
            field=models.BigIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
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
        migrations.SeparateDatabaseAndState(
            database_operations=[
                _replace_check(
                    "pgjobs_job_status_valid",
                    f'"status" IN {STATUSES_OLD}',
                    f'"status" IN {STATUSES_NEW}',
                ),
                _replace_check("pgjobs_job_finished_iff_terminal", FINISHED_OLD, FINISHED_NEW),
                migrations.RunSQL(
                    [
                        f'ALTER TABLE "{JOB}" ADD CONSTRAINT "pgjobs_job_blocked_waits" '
                        """CHECK ((NOT ("status" = 'blocked') OR ("waiting" >= 1 AND "waiting" IS NOT NULL)))"""
                        " NOT VALID",
                        f'ALTER TABLE "{JOB}" VALIDATE CONSTRAINT "pgjobs_job_blocked_waits"',
                    ],
                    reverse_sql=[f'ALTER TABLE "{JOB}" DROP CONSTRAINT "pgjobs_job_blocked_waits"'],
                ),
                migrations.RunSQL(
                    _unique_active("('blocked', 'pending', 'running')"),
                    reverse_sql=_unique_active("('pending', 'running')"),
                ),
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="pgjobs_job_status_valid"),
                migrations.RemoveConstraint(
                    model_name="job", name="pgjobs_job_finished_iff_terminal"
                ),
                migrations.RemoveConstraint(model_name="job", name="pgjobs_job_unique_active_uniq"),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(
                            ("status__in", ["blocked", "pending", "running"]),
                            ("unique_key__isnull", False),
                        ),
                        fields=("unique_key",),
                        name="pgjobs_job_unique_active_uniq",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                ["blocked", "pending", "running", "completed", "dead", "cancelled"],
                            )
                        ),
                        name="pgjobs_job_status_valid",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
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
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("status", "blocked"), _negated=True),
                            models.Q(("waiting__gte", 1), ("waiting__isnull", False)),
                            _connector="OR",
                        ),
                        name="pgjobs_job_blocked_waits",
                    ),
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("workflow_id__isnull", False)),
                fields=["workflow_id", "id"],
                name="pgjobs_job_workflow_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "blocked")),
                fields=["queue", "id"],
                name="pgjobs_job_blocked_idx",
            ),
        ),
        migrations.RunSQL([WORKFLOW_FUNCTIONS_V1], reverse_sql=[WORKFLOW_FUNCTIONS_DROP_V1]),
    ]
