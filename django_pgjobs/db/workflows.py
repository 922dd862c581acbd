"""Every statement of workflows and batches but the trigger, with what
each lock does: enqueue of a graph, parent results, batches, cancel, the admin's reads
and the repair pass. How a blocked job is released: ``db/workflow_trigger.py``.
"""

from __future__ import annotations

from django_pgjobs.db.epoch import epoch_us
from django_pgjobs.db.moves import declare
from django_pgjobs.db.tables import DEPENDENCY, JOB, NOTIFY_CHANNEL, RESULT, WORKFLOW
from django_pgjobs.db.workflow_trigger import BLOCKED, CANCELLED, FINISHED_SQL, PENDING, RUNNING
from django_pgjobs.states import JobStatus

WAITING = JobStatus.WAITING

# ---------------------------------------------------------------------------
# Enqueue of a graph: a workflow row and its job ids, then the nodes and edges
# (in chunks, for very large graphs), all in the caller's transaction.
# ---------------------------------------------------------------------------

# The run's row and an id for every node, allocated in node order: the client then
# writes nodes and edges with known ids (a parent always has a lower id than its
# children). nextval is not transactional: a rolled-back enqueue leaves a gap in
# the ids, as any rolled-back insert does.
WF_CREATE = f"""
WITH wf AS (
    INSERT INTO {WORKFLOW} (name, kind, created_at) VALUES (%(name)s, %(kind)s, now())
    RETURNING id
)
SELECT wf.id,
       ARRAY(SELECT nextval(s.seq) FROM (SELECT pg_get_serial_sequence('{JOB}', 'id') AS seq) s,
                    generate_series(1, %(n)s))
  FROM wf
"""

# One chunk of nodes with their edges (edges whose child is in the chunk). ON
# CONFLICT DO NOTHING covers the idempotency and unique_while indexes: a node whose
# key is taken is not written, and the caller, seeing it missing, raises and rolls
# its savepoint back (nothing of the workflow is left). ``notify``: the queues of
# the released roots, for the last chunk (NOTIFY is delivered at commit).
WF_INSERT_NODES = f"""
WITH nodes AS (
    INSERT INTO {JOB} (id, task, queue, priority, args, kwargs, run_at, max_attempts,
                       idempotency_key, timeout, concurrency_key, concurrency_limit,
                       unique_key, trace_context, status, workflow_id, node, waiting,
                       failed_parents, fair_key)
    SELECT u.id, u.task, u.queue, u.priority, u.args, u.kwargs,
           COALESCE(u.run_at, now() + make_interval(secs => COALESCE(u.delay, 0))),
           u.max_attempts, u.idempotency_key, u.timeout, u.concurrency_key,
           u.concurrency_limit, u.unique_key, %(trace_context)s::jsonb, u.status,
           %(workflow)s, u.node, u.waiting, u.failed_parents, u.fair_key
      FROM unnest(%(ids)s::bigint[], %(tasks)s::text[], %(queues)s::text[],
                  %(priorities)s::int[], %(args)s::jsonb[], %(kwargs)s::jsonb[],
                  %(run_at)s::timestamptz[], %(delay)s::float8[], %(max_attempts)s::int[],
                  %(idempotency_keys)s::text[], %(timeouts)s::float8[],
                  %(concurrency_keys)s::text[], %(concurrency_limits)s::int[],
                  %(unique_keys)s::text[], %(statuses)s::text[], %(nodes)s::text[],
                  %(waiting)s::int[], %(failed_parents)s::int[], %(fair_keys)s::text[])
        AS u(id, task, queue, priority, args, kwargs, run_at, delay, max_attempts,
             idempotency_key, timeout, concurrency_key, concurrency_limit, unique_key,
             status, node, waiting, failed_parents, fair_key)
    ON CONFLICT DO NOTHING
    RETURNING id, run_at, created_at
), edges AS (
    INSERT INTO {DEPENDENCY} (child_id, position, parent_id, parent_node, on_parent_failure,
                              receives)
    SELECT * FROM unnest(%(e_child)s::bigint[], %(e_position)s::int[], %(e_parent)s::bigint[],
                         %(e_parent_node)s::text[], %(e_on_failure)s::text[],
                         %(e_receives)s::text[])
)
SELECT id, {epoch_us("run_at")}, {epoch_us("created_at")}, NULL
  FROM nodes
UNION ALL
SELECT NULL, NULL, NULL, pg_notify('{NOTIFY_CHANNEL}', q)::text FROM unnest(%(notify)s::text[]) AS q
"""

# ---------------------------------------------------------------------------
# Running a node: its parents' results
# ---------------------------------------------------------------------------

# A node's parents in position order, without their values: each one's size where
# it is stored and whether it is compressed (pg_column_size and pg_column_compression
# read the tuple or TOAST pointer, they do not fetch or decompress the value), so
# the worker can read the values in pages of bounded size (PARENT_RESULT_PAGE).
# Read when the node runs, so no statement of the completion grows with the number
# of siblings. Reads only.
PARENT_EDGES = f"""
SELECT e.parent_id, e.parent_node, e.receives, pg_column_size(r.value),
       pg_column_compression(r.value) IS NOT NULL
  FROM {DEPENDENCY} e LEFT JOIN {RESULT} r ON r.job_id = e.parent_id
 WHERE e.child_id = %(id)s
 ORDER BY e.position
"""

# One page of a node's parents' results, by the parents' ids (through the results'
# primary key); the worker puts them in position order. A page holds small values
# only (a larger one is read by PARENT_RESULT_PIECES). Reads only.
PARENT_RESULT_PAGE = f"""
SELECT job_id, value FROM {RESULT} WHERE job_id = ANY(%(ids)s::bigint[])
"""

# One large (or compressed) parent result as rows of at most %(piece)s bytes of its
# UTF-8 text, in order: the worker streams them (one row at a time) and grows the
# value as they come, so neither the driver nor the worker holds the whole text
# beside the value. A string is sent as its text (#>> '{}', nothing left to decode);
# anything else as its JSON. MATERIALIZED: the value is detoasted and converted once,
# not once a piece; bytes, not characters, so finding a piece does not scan the text
# before it. Reads only.
PARENT_RESULT_PIECES = f"""
WITH v AS MATERIALIZED (
    SELECT jsonb_typeof(value) = 'string' AS plain,
           convert_to(CASE WHEN jsonb_typeof(value) = 'string' THEN value #>> '{{}}'
                           ELSE value::text END, 'UTF8') AS bytes
      FROM {RESULT} WHERE job_id = %(id)s
)
SELECT v.plain, substring(v.bytes FROM g * %(piece)s + 1 FOR %(piece)s)
  FROM v, generate_series(0, greatest(octet_length(v.bytes) - 1, 0) / %(piece)s) AS g
 ORDER BY g
"""

# The first of a node's parents whose row is gone (deleted by hand; the pruner keeps
# a parent until its children have finished): its result went with it, and a missing
# result must not pass for None. One primary-key probe per edge. Reads only.
PARENT_MISSING = f"""
SELECT e.parent_id, e.parent_node FROM {DEPENDENCY} e
 WHERE e.child_id = %(id)s
   AND NOT EXISTS (SELECT 1 FROM {JOB} p WHERE p.id = e.parent_id)
 ORDER BY e.position
 LIMIT 1
"""

# ---------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------

# Open a batch: store its callbacks (written, blocked, in the same transaction as
# its row), so a batch whose block never closed it can be closed by the repair pass.
BATCH_OPEN = f"""
UPDATE {WORKFLOW} SET callbacks = %(callbacks)s::jsonb
 WHERE id = %(id)s AND kind = 'batch' AND closed_at IS NULL
RETURNING id
"""

# Close a batch whose row BATCH_STATE locked (this statement's snapshot is taken
# after that lock). The members are what joined: those not finished yet, read from
# their rows, plus the outcomes counted on the batch row as members finished (a
# finished member's row may be gone, its count is not). A member finishing meanwhile
# has either committed before the lock (its row finished, its outcome counted) or
# waits for it (its row still unfinished to this snapshot, its outcome counted after
# us), so each member is counted once and exactly one of the two finds the batch
# complete. ``due``: fire it now (BATCH_FIRE).
BATCH_CLOSE = f"""
UPDATE {WORKFLOW}
   SET closed_at = now(),
       members = completed + dead + cancelled
                 + (SELECT count(*) FROM {JOB} j
                     WHERE j.workflow_id = %(id)s AND j.waiting IS NULL
                       AND j.status NOT IN {FINISHED_SQL})
 WHERE id = %(id)s AND kind = 'batch' AND closed_at IS NULL
RETURNING members, fired_at IS NULL AND completed + dead + cancelled >= members
"""

# Fire one batch now (see pgjobs_batch_fire): the close found it complete.
BATCH_FIRE = "SELECT pgjobs_batch_fire(ARRAY[%(id)s]::bigint[])"
declare("BATCH_FIRE", (BLOCKED, PENDING), (BLOCKED, CANCELLED))

# Whether a batch is closed, and its member count: a close retried after an error
# whose COMMIT may have landed finds its own earlier work here. Locks the batch row
# (members finishing now wait for the close, or committed before it) so BATCH_CLOSE,
# the next statement, counts with a snapshot taken after the lock.
BATCH_STATE = f"""
SELECT closed_at IS NOT NULL, members FROM {WORKFLOW} WHERE id = %(id)s FOR NO KEY UPDATE
"""

# ---------------------------------------------------------------------------
# Cancel, the graph
# ---------------------------------------------------------------------------

# Cancel every node of a run that has not finished (blocked, waiting, pending, running),
# locked in id order; the lease bump fences a running node's result. The trigger
# then does the rest (children already cancelled here only count the parent).
WF_CANCEL = f"""
WITH mine AS (
    SELECT id FROM {JOB}
     WHERE workflow_id = %(id)s AND status IN ('blocked', 'waiting', 'pending', 'running')
     ORDER BY id
       FOR NO KEY UPDATE
)
UPDATE {JOB} AS j
   SET status = 'cancelled', lease = j.lease + 1, finished_at = now(),
       last_error = 'cancelled with its workflow'
  FROM mine WHERE j.id = mine.id
RETURNING j.id
"""
declare(
    "WF_CANCEL",
    (BLOCKED, CANCELLED),
    (WAITING, CANCELLED),
    (PENDING, CANCELLED),
    (RUNNING, CANCELLED),
)

# Mark the run cancelled (after its nodes, so the lock order stays jobs -> run row).
WF_MARK_CANCELLED = f"""
UPDATE {WORKFLOW} SET cancelled_at = COALESCE(cancelled_at, now()) WHERE id = %(id)s
RETURNING id
"""

# The graph of a run (the admin's workflow page draws it): its nodes, then its
# edges. Two queries through the workflow index and the edges' primary key,
# bounded by %(limit)s (the edges: one probe per node, see WF_GRAPH_EDGES; OFFSET 0 keeps
# the lateral subquery a probe: flattened into a join, PostgreSQL 16 hashed the whole
# edges table for a run that is most of it). Reads only.
WF_NODES = f"""
SELECT id, node, task, queue, status, waiting, failed_parents, cancelled_by, last_error
  FROM {JOB} WHERE workflow_id = %(id)s ORDER BY id LIMIT %(limit)s
"""
WF_EDGES = f"""
SELECT e.parent_id, e.child_id, e.position, e.on_parent_failure, e.receives
  FROM (SELECT id FROM {JOB} WHERE workflow_id = %(id)s ORDER BY id LIMIT %(limit)s) c
 CROSS JOIN LATERAL (SELECT * FROM {DEPENDENCY} d WHERE d.child_id = c.id OFFSET 0) e
 ORDER BY e.child_id, e.position
"""

# The admin's workflow page and list. Reads only, each bounded in
# rows by its parameters, through the workflow index (pgjobs_job_workflow_idx) and
# the edges' primary key; tests/db/test_workflow_admin_plans.py pins the plans.

# A run's nodes by status: the exact progress of one run (its page), one pass over
# the run's index entries.
WF_STATUS_COUNTS = f"""
SELECT status, count(*) FROM {JOB} WHERE workflow_id = %(id)s GROUP BY status
"""

# The progress of the runs on one list page: per run, the statuses of at most
# %(cap)s of its nodes (a larger run shows "cap+" and its page counts exactly).
WF_LIST_PROGRESS = f"""
SELECT r.id, c.status, c.n
  FROM unnest(%(ids)s::bigint[]) AS r(id)
 CROSS JOIN LATERAL (
       SELECT s.status, count(*) AS n
         FROM (SELECT status FROM {JOB} WHERE workflow_id = r.id ORDER BY id LIMIT %(cap)s) s
        GROUP BY s.status) c
"""

# The nodes the graph draws: the first %(head)s and the last %(tail)s of the run by
# id (ids are allocated parents first, so the head holds the roots and the tail the
# final nodes); the middle of a larger run is summed up from WF_STATUS_COUNTS.
WF_GRAPH_NODES = f"""
(SELECT id, node, task, status, true AS head FROM {JOB}
  WHERE workflow_id = %(id)s ORDER BY id LIMIT %(head)s)
UNION ALL
(SELECT id, node, task, status, false FROM {JOB}
  WHERE workflow_id = %(id)s ORDER BY id DESC LIMIT %(tail)s)
"""

# The edges into the drawn nodes, at most %(limit)s (a callback of 10,000 parents
# has 10,000): one primary-key probe (child_id, position) per drawn node, a nested
# loop whatever the statistics say (a plain ``child_id = ANY(...)`` of 1,500 ids was
# planned as a scan of the whole edges table).
WF_GRAPH_EDGES = f"""
SELECT e.parent_id, e.child_id
  FROM unnest(%(ids)s::bigint[]) AS c(id)
 CROSS JOIN LATERAL (SELECT parent_id, child_id FROM {DEPENDENCY}
                      WHERE child_id = c.id ORDER BY position) e
 LIMIT %(limit)s
"""

# What "retry the failed nodes" retries: the run's dead nodes and the ones cancelled
# on their own (not by a parent), whose parents all completed. Their dependents that
# their failure cancelled are resumed by the trigger when they are retried; a failed
# node below another is left to a later call, once its parent has completed.
WF_FAILED_ROOTS = f"""
SELECT j.id FROM {JOB} j
 WHERE j.workflow_id = %(id)s
   AND (j.status = 'dead' OR (j.status = 'cancelled' AND j.cancelled_by IS NULL))
   AND NOT EXISTS (SELECT 1 FROM {DEPENDENCY} e JOIN {JOB} p ON p.id = e.parent_id
                    WHERE e.child_id = j.id AND p.status <> 'completed')
 ORDER BY j.id
"""

# Blocked jobs per queue, through the blocked index (jobs_status, metrics). Reads only.
STATUS_BLOCKED = f"""
SELECT queue, count(*) FROM {JOB} WHERE status = 'blocked' GROUP BY queue
"""

# ---------------------------------------------------------------------------
# The repair pass (maintenance): what a crash could leave. By construction nothing:
# release and cancel commit with the parent's move. Rows written with triggers off
# (session_replication_role = replica, a restore) or edited by hand are repaired.
# ---------------------------------------------------------------------------

# 1. Lock a batch of blocked jobs (SKIP LOCKED: never waits for a completer that
# is releasing them right now). In its own statement: the recount below then runs
# with a snapshot taken after the locks, so it sees every parent that finished
# before; a parent finishing later waits for these locks and counts itself.
# Only jobs enqueued %(min_age)s seconds ago or more (``created_at`` is a statement
# timestamp, as Django stamps it): a young workflow is draining, and recounting a
# chord's callback holds its row while its members' completions wait for it (a
# recount per worker, in every chord drain a worker started beside); what
# the pass repairs was written by hand or with triggers off.
WF_REPAIR_LOCK = f"""
SELECT id FROM {JOB}
 WHERE status = 'blocked' AND id > %(after)s
   AND created_at <= statement_timestamp() - make_interval(secs => %(min_age)s)
 ORDER BY id
 LIMIT %(batch)s
   FOR NO KEY UPDATE SKIP LOCKED
"""

# 2. Recount their parents and fix what disagrees: release, cancel, or correct the
# counters. Returns (id, new status, queue) of the rows it changed.
WF_REPAIR = f"""
WITH b AS (
    SELECT unnest(%(ids)s::bigint[]) AS id
), truth AS (
    SELECT b.id,
           count(*) FILTER (WHERE p.status NOT IN {FINISHED_SQL})::int AS waiting,
           count(*) FILTER (WHERE p.status IN ('dead', 'cancelled'))::int AS failed,
           bool_or(e.on_parent_failure = 'cancel') AS cancel_on_failure,
           min(p.id) FILTER (WHERE p.status IN ('dead', 'cancelled')) AS culprit
      FROM b JOIN {DEPENDENCY} e ON e.child_id = b.id
      LEFT JOIN {JOB} p ON p.id = e.parent_id
     GROUP BY b.id
), decided AS (
    SELECT t.*, CASE WHEN t.failed > 0 AND t.cancel_on_failure THEN 'cancelled'
                     WHEN t.waiting > 0 THEN 'blocked'
                     ELSE 'pending' END AS becomes
      FROM truth t
), fixed AS (
    UPDATE {JOB} c
       SET waiting = d.waiting, failed_parents = d.failed, status = d.becomes,
           run_at = CASE WHEN d.becomes = 'pending' THEN greatest(c.run_at, now())
                         ELSE c.run_at END,
           finished_at = CASE WHEN d.becomes = 'cancelled' THEN now() ELSE NULL END,
           cancelled_by = CASE WHEN d.becomes = 'cancelled' THEN d.culprit END,
           last_error = CASE WHEN d.becomes = 'cancelled'
                             THEN 'cancelled by the repair pass: its parent job #'
                                  || d.culprit || ' ended dead or cancelled'
                             ELSE c.last_error END
      FROM decided d
     WHERE c.id = d.id AND c.status = 'blocked'
       AND (d.becomes <> 'blocked' OR c.waiting <> d.waiting
            OR c.failed_parents IS DISTINCT FROM d.failed)
    RETURNING c.id, c.status, c.queue
), woken AS (
    SELECT DISTINCT queue FROM fixed WHERE status = 'pending'
)
SELECT id, status, queue, NULL FROM fixed
UNION ALL
SELECT NULL, NULL, NULL, pg_notify('{NOTIFY_CHANNEL}', queue)::text FROM woken
"""
declare("WF_REPAIR", (BLOCKED, PENDING), (BLOCKED, CANCELLED))

# Open batches whose block ended without closing them (the enqueuing process died):
# opened, and last joined by a member, %(grace)s seconds ago or more. The newest
# member is the run's highest id (ids grow; the workflow index is (workflow_id, id)),
# one index probe per batch. Locked (SKIP LOCKED: a close or a member's completion
# holding the row is left to the next pass); each is then closed by BATCH_CLOSE.
BATCH_ABANDONED = f"""
SELECT w.id FROM {WORKFLOW} w
 WHERE w.kind = 'batch' AND w.fired_at IS NULL AND w.closed_at IS NULL
   AND greatest(w.created_at,
                (SELECT j.created_at FROM {JOB} j WHERE j.workflow_id = w.id
                  ORDER BY j.id DESC LIMIT 1))
       <= statement_timestamp() - make_interval(secs => %(grace)s)
 ORDER BY w.id
 LIMIT %(batch)s
   FOR NO KEY UPDATE SKIP LOCKED
"""

# Closed batches not fired although none of their members is unfinished (their
# counts were bypassed): recount from the member rows still there, and fire.
BATCH_REPAIR = f"""
WITH stuck AS (
    SELECT w.id FROM {WORKFLOW} w
     WHERE w.kind = 'batch' AND w.fired_at IS NULL AND w.closed_at IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM {JOB} j
                        WHERE j.workflow_id = w.id AND j.waiting IS NULL
                          AND j.status IN ('blocked', 'pending', 'running'))
     ORDER BY w.id
     LIMIT %(batch)s
       FOR NO KEY UPDATE SKIP LOCKED
), counts AS (
    SELECT s.id,
           count(*) FILTER (WHERE j.status = 'completed') AS completed,
           count(*) FILTER (WHERE j.status = 'dead') AS dead,
           count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled
      FROM stuck s LEFT JOIN {JOB} j ON j.workflow_id = s.id AND j.waiting IS NULL
     GROUP BY s.id
)
UPDATE {WORKFLOW} w
   SET completed = greatest(w.completed, c.completed), dead = greatest(w.dead, c.dead),
       cancelled = greatest(w.cancelled, c.cancelled),
       members = least(w.members, greatest(w.completed, c.completed)
                       + greatest(w.dead, c.dead) + greatest(w.cancelled, c.cancelled))
  FROM counts c
 WHERE w.id = c.id
RETURNING w.id
"""
