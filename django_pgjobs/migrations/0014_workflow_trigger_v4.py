"""The workflow trigger, version 4 (the edges read one parent at a time):

* the step reads the edges of the parents a statement finished (or retried) one parent
  at a time through the edges' parent index (``CROSS JOIN LATERAL (... OFFSET 0)``),
  and the retry path locks the children as an array taken that way; in version 3 a
  generic plan could read a child's edges by the primary key instead and filter them
  (completing 300 members of a young 10,000-member chord once fetched all 10,000 edges
  on the embedded server: the plan followed what the statistics said);
* the finished statuses come from one list (``states.FINISHED``), the array literal of
  version 3 included.

Recreates the workflow functions (CREATE OR REPLACE, same signatures) and the trigger
as 0013 does; no table changes. Reversible: the reverse restores version 3 (0013's
text).

Frozen: ``WORKFLOW_FUNCTIONS_V4`` is the SQL text this migration runs, whatever later
code says (``tests/test_migrations_frozen.py`` keeps the newest migration's copy equal
to ``db.workflow_trigger.WORKFLOW_FUNCTIONS``).
"""

import importlib

from django.db import migrations

WORKFLOW_FUNCTIONS_V3 = importlib.import_module(
    "django_pgjobs.migrations.0013_workflow_trigger_v3"
).WORKFLOW_FUNCTIONS_V3

WORKFLOW_FUNCTIONS_V4 = r"""
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
LANGUAGE plpgsql
-- Plan each statement once per session: planning the release statement (two joins
-- of the jobs table and its nine indexes) took about 0.9 ms at every call, five
-- times its run (a custom plan per call for the array parameters); the generic
-- plans probe the same indexes (tests/test_workflow_scale.py).
SET plan_cache_mode = force_generic_plan
-- ... and never by a sequential scan: every statement here finds its rows by id
-- (the parents' edges by their parent index, jobs and batches by primary key). A
-- generic plan cannot see how long the arrays are, and on a young edges table
-- (10,000 rows, no statistics yet) it read all of it for "parent_id = ANY (done_ids)",
-- testing each row against the whole array: 24 ms for a 300-member completion, a
-- cost per member that grew with the table (performance.md, version 3).
SET enable_seqscan = off
AS $fn$
DECLARE
    done_ids bigint[];  -- parents that finished
    done_st text[];     -- ... and how
    back_ids bigint[];  -- parents that left a finished status (a retry)
    back_st text[];     -- ... and the finished status they left
    woken text[];       -- queues of released jobs
    due bigint[];       -- batches to fire
    retried bigint[];   -- the members this statement moved out of a finished status
    -- the locked children of a turn, and what the turn's parents bring each
    k_ids bigint[];
    k_done int[];
    k_failed int[];
    k_culprit bigint[];
    k_cancel boolean[];
    k_why text[];
BEGIN
    PERFORM set_config('pgjobs.workflow_step', 'on', true);
    IF NOT (moved_olds && ARRAY['cancelled', 'completed', 'dead']) THEN
        -- The usual case, without a query: every member moved here finished (none
        -- left a finished status, and each moved into or out of one).
        done_ids := moved_ids;
        done_st := moved_news;
    ELSE
        SELECT array_agg(c.id) FILTER (WHERE c.new IN ('cancelled', 'completed', 'dead')),
               array_agg(c.new) FILTER (WHERE c.new IN ('cancelled', 'completed', 'dead')),
               array_agg(c.id) FILTER (WHERE c.old IN ('cancelled', 'completed', 'dead')),
               array_agg(c.old) FILTER (WHERE c.old IN ('cancelled', 'completed', 'dead'))
          INTO done_ids, done_st, back_ids, back_st
          FROM unnest(moved_ids, moved_olds, moved_news) AS c(id, old, new);
    END IF;
    retried := back_ids;

    -- 1. Finished parents: each child's counters go down; a blocked child is
    -- released at zero, or cancelled by a parent that ended dead or cancelled,
    -- which is passed on to its own children in the next turn.
    WHILE done_ids IS NOT NULL LOOP
        -- One pass over the parents' edges (by their parent index): what they bring
        -- each child, whose rows are locked in id order. The edges of a finished
        -- parent do not change; the children's counters are read by the next
        -- statement, whose snapshot sees every parent finished by a transaction
        -- that held these locks before us.
        SELECT array_agg(x.id ORDER BY x.id), array_agg(x.done ORDER BY x.id),
               array_agg(x.failed ORDER BY x.id), array_agg(x.culprit ORDER BY x.id),
               array_agg(x.cancel_on_failure ORDER BY x.id), array_agg(x.why ORDER BY x.id)
          INTO k_ids, k_done, k_failed, k_culprit, k_cancel, k_why
          FROM (SELECT agg.* FROM (
                    SELECT e.child_id AS id, count(*)::int AS done,
                           count(*) FILTER (WHERE p.status <> 'completed')::int AS failed,
                           min(p.id) FILTER (WHERE p.status <> 'completed') AS culprit,
                           bool_or(e.on_parent_failure = 'cancel') AS cancel_on_failure,
                           (array_agg(format('%s%s ended %s', p.id,
                                             COALESCE(' (' || e.parent_node || ')', ''), p.status)
                                      ORDER BY p.id) FILTER (WHERE p.status <> 'completed'))[1] AS why
                      FROM unnest(done_ids, done_st) AS p(id, status) CROSS JOIN LATERAL (
                    SELECT e.child_id, e.on_parent_failure, e.parent_node FROM @SCHEMA@.django_pgjobs_jobdependency e
                     WHERE e.parent_id = p.id OFFSET 0) e
                     GROUP BY e.child_id) agg
                  JOIN @SCHEMA@.django_pgjobs_job c ON c.id = agg.id
                 WHERE c.status IN ('blocked', 'cancelled')
                 ORDER BY c.id
                   FOR NO KEY UPDATE OF c) x;
        EXIT WHEN k_ids IS NULL;  -- no child waits (a chain's end, a callback)
        WITH decided AS (
            SELECT d.*, c.status AS was,
                   CASE WHEN c.status <> 'blocked' THEN c.status
                        WHEN d.failed > 0 AND d.cancel_on_failure THEN 'cancelled'
                        WHEN c.waiting - d.done > 0 THEN 'blocked'
                        ELSE 'pending' END AS becomes
              FROM unnest(k_ids, k_done, k_failed, k_culprit, k_cancel, k_why)
                   AS d(id, done, failed, culprit, cancel_on_failure, why)
              JOIN @SCHEMA@.django_pgjobs_job c ON c.id = d.id
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
        IF woken IS NOT NULL THEN
            PERFORM pg_notify('pgjobs', q) FROM unnest(woken) AS q;
        END IF;
    END LOOP;

    -- 2. Retried parents: children they cancelled wait for them again (and pass
    -- it on to their own children); other children only count them again. A child
    -- retried by the same statement (pending, its counter stale) waits for them too.
    WHILE back_ids IS NOT NULL LOOP
        PERFORM 1 FROM @SCHEMA@.django_pgjobs_job c
         WHERE c.id = ANY (ARRAY(SELECT e.child_id FROM unnest(back_ids) AS p(id) CROSS JOIN LATERAL (
                    SELECT e.child_id FROM @SCHEMA@.django_pgjobs_jobdependency e
                     WHERE e.parent_id = p.id OFFSET 0) e))
           AND (c.status IN ('blocked', 'cancelled') OR c.id = ANY (retried))
         ORDER BY c.id
           FOR NO KEY UPDATE OF c;
        WITH p AS (
            SELECT * FROM unnest(back_ids, back_st) AS p(id, status)
        ), agg AS (
            SELECT e.child_id AS id, count(*)::int AS back,
                   count(*) FILTER (WHERE p.status <> 'completed')::int AS unfailed
              FROM p CROSS JOIN LATERAL (
                    SELECT e.child_id FROM @SCHEMA@.django_pgjobs_jobdependency e
                     WHERE e.parent_id = p.id OFFSET 0) e
             GROUP BY e.child_id
        ), decided AS (
            SELECT agg.*, c.status AS was,
                   CASE WHEN c.status = 'cancelled' AND c.cancelled_by IS NOT NULL
                             AND COALESCE(c.failed_parents, 0) - agg.unfailed <= 0
                        THEN 'blocked'
                        WHEN c.status = 'pending' THEN 'blocked'
                        ELSE c.status END AS becomes
              FROM agg JOIN @SCHEMA@.django_pgjobs_job c ON c.id = agg.id
             WHERE c.status IN ('blocked', 'cancelled')
                OR (c.status = 'pending' AND c.id = ANY (retried))
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
    -- Ends here, in one query: the step's own writes (it handles their consequences
    -- itself), and every statement that moved no workflow member into or out of a
    -- finished status: a plain statement, and a claim or heartbeat of members.
    IF current_setting('pgjobs.workflow_step', true) = 'on'
       OR NOT (EXISTS (SELECT 1 FROM pgjobs_new n
                        WHERE n.workflow_id IS NOT NULL AND n.status IN ('cancelled', 'completed', 'dead'))
               OR EXISTS (SELECT 1 FROM pgjobs_old o
                           WHERE o.workflow_id IS NOT NULL AND o.status IN ('cancelled', 'completed', 'dead'))) THEN
        RETURN NULL;
    END IF;
    -- Members that entered or left a finished status: five arrays filled in one pass,
    -- so aligned, in no particular order (the step takes every lock in id order
    -- itself; sorting each array cost a sort per array per statement).
    SELECT array_agg(n.id), array_agg(n.workflow_id), array_agg(n.waiting IS NULL),
           array_agg(o.status::text), array_agg(n.status::text)
      INTO ids, wfs, members, olds, news
      FROM pgjobs_new n JOIN pgjobs_old o ON o.id = n.id
     WHERE n.workflow_id IS NOT NULL
       AND (n.status IN ('cancelled', 'completed', 'dead')) <> (o.status IN ('cancelled', 'completed', 'dead'));
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


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0013_workflow_trigger_v3")]

    operations = [
        migrations.RunSQL([WORKFLOW_FUNCTIONS_V4], reverse_sql=[WORKFLOW_FUNCTIONS_V3]),
    ]
