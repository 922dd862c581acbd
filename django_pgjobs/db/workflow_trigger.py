"""The workflow trigger: how the database releases, cancels and resumes
blocked jobs in the transaction that moves their parents.

How a blocked job is released: the database does it, in the transaction that
finishes its last parent, whoever finishes it. One statement-level ``AFTER UPDATE``
trigger on the jobs table (``pgjobs_workflow_trigger``, created by the migrations
from ``WORKFLOW_FUNCTIONS``) sees the rows each UPDATE changed (its transition
tables) and hands the workflow members that entered or left a finished status to
``pgjobs_workflow_step``. That function, per parent that finished, decrements the
``waiting`` counter of each child and releases it (blocked -> pending) at zero, or
cancels it when the parent ended dead or cancelled (``on_parent_failure="cancel"``),
passing the cancel on to the child's own children; per parent that was retried, it
resumes the children its failure cancelled and puts back to blocked the ones released
while it was failed and not claimed yet; per batch member, it counts the outcome
on the batch's row and fires the batch's callbacks once the batch is closed and
every member has finished. So every path that finishes a job (the completer, a
retry that dead-letters, a timeout, the reaper, cancel, the unknown-task sweeper,
the admin, psql) releases or cancels in its own transaction, with nothing to poll.

Why exactly once under READ COMMITTED: the children are locked (``FOR NO KEY
UPDATE``) before their counters are read, in the next statement, with a fresh
snapshot. Two transactions finishing the last two parents of one child at the same
moment: the second waits for the first's lock, then reads the counter the first
committed, so one of them, and only one, sees it reach zero.

Why a statement-level trigger (and not a row-level one): all the children of all
the parents a statement finished are locked in ONE id-ordered pass, so two
completers finishing members of two chords, interleaved, can never wait on each
other in a cycle (row by row, each would lock the callbacks in its own parents'
order: a deadlock), and a child's counter is decremented once per statement, by
the number of its parents that statement finished (a 300-job completion batch of
one chord updates the callback's row once, not 300 times). A plain statement, and a
claim or heartbeat of members, ends in the trigger's first query: one scan of its
new and old rows for a member in a finished status. The step locks the children and counts what the
parents bring each in one pass over the edges, and plans its statements once per
session (re-planning them cost more than running them), never with a sequential
scan (on a young edges table the generic plan read every edge at every completion).

Lock order everywhere: the rows the statement itself changes, then children in id
order, then batch rows in id order, then a batch's callbacks (each batch fires
once, under its row's lock, so two transactions never release the same callbacks).
"""

from __future__ import annotations

from django_pgjobs.db.functions import DO_IN_JOBS_SCHEMA
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import DEPENDENCY, JOB, NOTIFY_CHANNEL, WORKFLOW
from django_pgjobs.states import FINISHED, JobStatus

BLOCKED, PENDING, RUNNING, CANCELLED, DEAD = (
    JobStatus.BLOCKED,
    JobStatus.PENDING,
    JobStatus.RUNNING,
    JobStatus.CANCELLED,
    JobStatus.DEAD,
)

#: The transaction-local setting that marks the step's own writes: the trigger of
#: a statement the step runs returns at once (the step computes their consequences
#: itself, in a loop: a chain of 1,000 cancelled nodes is 1,000 turns of a loop,
#: not 1,000 nested triggers, which would exhaust the server's stack).
STEP_SETTING = "pgjobs.workflow_step"

_FINISHED_ITEMS = ", ".join(f"'{status}'" for status in FINISHED)
#: The finished statuses as an SQL list (the trigger and the repair pass) and array.
FINISHED_SQL = f"({_FINISHED_ITEMS})"
FINISHED_ARRAY = f"ARRAY[{_FINISHED_ITEMS}]"

# ---------------------------------------------------------------------------
# The trigger and its functions: this is their one text, which the migrations run.
# Created in the jobs table's schema; every table is schema-qualified (@SCHEMA@), so
# a caller's search_path cannot redirect them. No SET search_path on the functions:
# that would save and restore a setting at every UPDATE statement of the jobs table.
# They run with the privileges of whoever updates the jobs.
# ---------------------------------------------------------------------------

_TRIGGER_FUNCTION = f"""
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
    IF current_setting('{STEP_SETTING}', true) = 'on'
       OR NOT (EXISTS (SELECT 1 FROM pgjobs_new n
                        WHERE n.workflow_id IS NOT NULL AND n.status IN {FINISHED_SQL})
               OR EXISTS (SELECT 1 FROM pgjobs_old o
                           WHERE o.workflow_id IS NOT NULL AND o.status IN {FINISHED_SQL})) THEN
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
       AND (n.status IN {FINISHED_SQL}) <> (o.status IN {FINISHED_SQL});
    IF ids IS NOT NULL THEN
        PERFORM @SCHEMA@.pgjobs_workflow_step(ids, wfs, members, olds, news);
    END IF;
    RETURN NULL;
END
$fn$
"""


def _edges_of(parents: str, columns: str = "e.child_id") -> str:
    """The edges of the parents in the array ``parents`` (an ``unnest`` alias ``p``
    with ``id`` first), each parent's read through the edges' parent index and nothing
    else: ``OFFSET 0`` keeps the lateral subquery a probe per parent, so no plan can
    read the edges by another index (a child's, whose callback has 10,000 edges) and
    filter them, whatever the statistics of a young table say (version 4)."""
    return f"""{parents} CROSS JOIN LATERAL (
                    SELECT {columns} FROM @SCHEMA@.{DEPENDENCY} e
                     WHERE e.parent_id = p.id OFFSET 0) e"""


def _lock_children(parents: str, also: str = "false") -> str:
    """The step's first statement of each turn: lock the blocked or cancelled children
    of the parents in the array variable ``parents`` (and those matching ``also``), in
    id order. The children as an array (an InitPlan run once), then their rows by
    primary key: a semi-join could start from the blocked jobs and read all of each
    one's edges."""
    edges = _edges_of(f"unnest({parents}) AS p(id)")
    return f"""PERFORM 1 FROM @SCHEMA@.{JOB} c
         WHERE c.id = ANY (ARRAY(SELECT e.child_id FROM {edges}))
           AND (c.status IN ('blocked', 'cancelled') OR {also})
         ORDER BY c.id
           FOR NO KEY UPDATE OF c;"""


_EDGE_COLUMNS = "e.child_id, e.on_parent_failure, e.parent_node"

# The step, given the workflow members a statement moved into or out of a finished
# status. ``moved_members``: the row is a batch member (no parents: waiting IS NULL).
# Children whose counters change are blocked or cancelled ones (a child that was
# released already ran, or runs, on its own terms).
_STEP_FUNCTION = f"""
CREATE OR REPLACE FUNCTION @SCHEMA@.pgjobs_workflow_step(
    moved_ids bigint[], moved_wfs bigint[], moved_members boolean[], moved_olds text[],
    moved_news text[]
) RETURNS void
LANGUAGE plpgsql
-- Plan each statement once per session: planning the release statement (two joins
-- of the jobs table and its nine indexes) cost several times its run at every call
-- (a custom plan per call for the array parameters); the generic
-- plans probe the same indexes (tests/db/test_workflow_scale.py).
SET plan_cache_mode = force_generic_plan
-- ... and never by a sequential scan: every statement here finds its rows by id
-- (the parents' edges by their parent index, jobs and batches by primary key). A
-- generic plan cannot see how long the arrays are, and on a young edges table
-- (no statistics yet) it read all of it for "parent_id = ANY (done_ids)", testing
-- each row against the whole array: a cost per member that grew with the table.
SET enable_seqscan = off
AS $fn$
DECLARE
    done_ids bigint[];  -- parents that finished
    done_st text[];     -- ... and how
    back_ids bigint[];  -- parents that left a finished status (a retry)
    back_st text[];     -- ... and the finished status they left
    woken text[];       -- queues of released jobs
    due bigint[];       -- batches to fire
    -- the locked children of a turn, and what the turn's parents bring each
    k_ids bigint[];
    k_done int[];
    k_failed int[];
    k_culprit bigint[];
    k_cancel boolean[];
    k_why text[];
BEGIN
    PERFORM set_config('{STEP_SETTING}', 'on', true);
    IF NOT (moved_olds && {FINISHED_ARRAY}) THEN
        -- The usual case, without a query: every member moved here finished (none
        -- left a finished status, and each moved into or out of one).
        done_ids := moved_ids;
        done_st := moved_news;
    ELSE
        SELECT array_agg(c.id) FILTER (WHERE c.new IN {FINISHED_SQL}),
               array_agg(c.new) FILTER (WHERE c.new IN {FINISHED_SQL}),
               array_agg(c.id) FILTER (WHERE c.old IN {FINISHED_SQL}),
               array_agg(c.old) FILTER (WHERE c.old IN {FINISHED_SQL})
          INTO done_ids, done_st, back_ids, back_st
          FROM unnest(moved_ids, moved_olds, moved_news) AS c(id, old, new);
    END IF;

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
                      FROM {_edges_of("unnest(done_ids, done_st) AS p(id, status)", _EDGE_COLUMNS)}
                     GROUP BY e.child_id) agg
                  JOIN @SCHEMA@.{JOB} c ON c.id = agg.id
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
              JOIN @SCHEMA@.{JOB} c ON c.id = d.id
             WHERE c.status IN ('blocked', 'cancelled')
        ), moved AS (
            UPDATE @SCHEMA@.{JOB} c
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
            PERFORM pg_notify('{NOTIFY_CHANNEL}', q) FROM unnest(woken) AS q;
        END IF;
    END LOOP;

    -- 2. Retried parents: children they cancelled wait for them again (and pass
    -- it on to their own children); other blocked children only count them again. A
    -- pending child (released while they were failed, not claimed yet, or retried
    -- before them or by the same statement) waits for them too: a job whose parents
    -- have not all finished is blocked, whatever order the retries came in. A child
    -- claimed already (running) or finished keeps what it did.
    WHILE back_ids IS NOT NULL LOOP
        {_lock_children("back_ids", "c.status = 'pending'")}
        WITH p AS (
            SELECT * FROM unnest(back_ids, back_st) AS p(id, status)
        ), agg AS (
            SELECT e.child_id AS id, count(*)::int AS back,
                   count(*) FILTER (WHERE p.status <> 'completed')::int AS unfailed
              FROM {_edges_of("p")}
             GROUP BY e.child_id
        ), decided AS (
            SELECT agg.*, c.status AS was,
                   CASE WHEN c.status = 'cancelled' AND c.cancelled_by IS NOT NULL
                             AND COALESCE(c.failed_parents, 0) - agg.unfailed <= 0
                        THEN 'blocked'
                        WHEN c.status = 'pending' THEN 'blocked'
                        ELSE c.status END AS becomes
              FROM agg JOIN @SCHEMA@.{JOB} c ON c.id = agg.id
             WHERE c.status IN ('blocked', 'cancelled', 'pending')
        ), moved AS (
            UPDATE @SCHEMA@.{JOB} c
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
        PERFORM 1 FROM @SCHEMA@.{WORKFLOW} w
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
            UPDATE @SCHEMA@.{WORKFLOW} w
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
    PERFORM set_config('{STEP_SETTING}', '', true);
END
$fn$
"""

# Fire the callbacks of closed batches whose members have all finished, once: the
# batch rows are locked (id order) and marked fired; ``on_complete`` is released,
# ``on_success`` only when no member ended dead or cancelled, ``on_failure`` only
# when one did (the other is cancelled, saying why). A callback made with ``.s()``
# gets {"completed": n, "dead": n, "cancelled": n} as its first argument, the counts
# when the batch finished. Called by the step (a member's move) and by BATCH_CLOSE.
_FIRE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION @SCHEMA@.pgjobs_batch_fire(batches bigint[]) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    woken text[];
    n integer;
BEGIN
    WITH fired AS (
        UPDATE @SCHEMA@.{WORKFLOW} w SET fired_at = now()
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
        UPDATE @SCHEMA@.{JOB} c
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
    PERFORM pg_notify('{NOTIFY_CHANNEL}', q) FROM unnest(woken) AS q;
    RETURN n;
END
$fn$
"""

_TRIGGER = f"""
CREATE TRIGGER pgjobs_workflow_step AFTER UPDATE ON @SCHEMA@.{JOB}
REFERENCING OLD TABLE AS pgjobs_old NEW TABLE AS pgjobs_new
FOR EACH STATEMENT EXECUTE FUNCTION @SCHEMA@.pgjobs_workflow_trigger()
"""


def _in_jobs_schema(*statements: str) -> str:
    """A DO block that runs each statement with @SCHEMA@ replaced by the jobs
    table's schema (as ENQUEUE_FUNCTION does in db/functions.py)."""
    parts = []
    for i, statement in enumerate(statements):
        tag = f"s{i}"
        parts.append(
            f"EXECUTE replace(${tag}${statement}${tag}$, '@SCHEMA@', quote_ident(schema_name));"
        )
    body = "\n".join(parts)
    return f"""{DO_IN_JOBS_SCHEMA}
{body}
END
$do$
"""


# The workflow functions and trigger, as one statement (the squashed migration runs it,
# and migration 0002 again; each part replaces what it creates, so running it again
# installs this text).
WORKFLOW_FUNCTIONS = _in_jobs_schema(
    _FIRE_FUNCTION,
    _STEP_FUNCTION,
    _TRIGGER_FUNCTION,
    f"DROP TRIGGER IF EXISTS pgjobs_workflow_step ON @SCHEMA@.{JOB}",
    _TRIGGER,
)

# The moves the trigger's step (and pgjobs_batch_fire) make, in the transaction of
# the statement that moved a parent: release, cancel (a parent failed), resume (the
# failed parent was retried), wait again (a released child of a retried parent).
declare(
    "WORKFLOW_FUNCTIONS",
    (BLOCKED, PENDING),
    (BLOCKED, CANCELLED),
    (CANCELLED, BLOCKED),
    (PENDING, BLOCKED),
)

WORKFLOW_FUNCTIONS_DROP = _in_jobs_schema(
    f"DROP TRIGGER IF EXISTS pgjobs_workflow_step ON @SCHEMA@.{JOB}",
    "DROP FUNCTION IF EXISTS @SCHEMA@.pgjobs_workflow_trigger()",
    "DROP FUNCTION IF EXISTS @SCHEMA@.pgjobs_workflow_step(bigint[], bigint[], boolean[], text[], text[])",
    "DROP FUNCTION IF EXISTS @SCHEMA@.pgjobs_batch_fire(bigint[])",
)
