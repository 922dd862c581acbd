"""The pruner's statements: finished history past its retention, deleted in batches."""

from __future__ import annotations

from django_pgjobs.db.tables import DEPENDENCY, JOB, RESULT, SIGNAL, STEP, WORKFLOW
from django_pgjobs.states import FINISHED

_FINISHED = "(" + ", ".join(f"'{status}'" for status in FINISHED) + ")"

# A workflow job is kept while something still needs it: a parent (with its result)
# while one of its children has not finished (blocked, or released and not yet run:
# the child reads its parents' results when it runs), and a batch member while its
# batch has not fired (open, or closed with members still running: the batch's page
# and its repair pass read its members). Plain jobs skip both probes (workflow_id IS
# NULL); a workflow job's are index probes (the edges' parent index and each child's
# primary key; the run's primary key). OFFSET 0 keeps each a probe of the row at
# hand: without it PostgreSQL may hash the subquery once per statement, and for "a
# child not finished" that reads every job of the table (a sequential scan).
_NOT_NEEDED = f"""(workflow_id IS NULL OR (NOT EXISTS (
           SELECT 1 FROM {DEPENDENCY} e
             JOIN {JOB} c ON c.id = e.child_id AND c.status NOT IN {_FINISHED}
            WHERE e.parent_id = {JOB}.id OFFSET 0)
       AND NOT EXISTS (
           SELECT 1 FROM {WORKFLOW} w
            WHERE w.id = {JOB}.workflow_id AND w.kind = 'batch' AND w.fired_at IS NULL
           OFFSET 0)))"""

# Delete one batch of finished jobs of one status older than the retention (a
# workflow job still needed is kept, see above; a pruned
# workflow job's edges to its parents go with it, found by the edges' primary key).
# No "--" comment inside: pg_cron runs this text flattened to one line.
# Walks the partial finished_at index oldest first; FOR UPDATE SKIP LOCKED lets
# pruners on many hosts take disjoint rows and never wait on an admin retry of
# the same row (the row is re-checked after locking, so a job retried meanwhile
# is not deleted). Each batch is its own short transaction (autocommit), so row
# locks live for milliseconds. Results go with their job unless they carry an
# idempotency key that must keep protecting; keys of recurring jobs ('cron:...')
# only matter within the catch-up window, so those results go too. A durable job's
# steps and signals go with it here (no foreign key cascades them: their job_id is a
# plain column), each found by an index that leads with job_id.
JOB_PRUNE_BATCH = f"""
WITH doomed AS (
    SELECT id FROM {JOB}
     WHERE finished_at IS NOT NULL
       AND finished_at < now() - make_interval(secs => %(older_than)s)
       AND status = %(status)s
       AND {_NOT_NEEDED}
     ORDER BY finished_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {JOB} AS j USING doomed WHERE j.id = doomed.id
    RETURNING j.id, j.idempotency_key
), results AS (
    DELETE FROM {RESULT} AS r USING gone
     WHERE r.job_id = gone.id
       AND (gone.idempotency_key IS NULL OR gone.idempotency_key LIKE 'cron:%%')
), edges AS (
    DELETE FROM {DEPENDENCY} AS e USING gone WHERE e.child_id = gone.id
), steps AS (
    DELETE FROM {STEP} AS s USING gone WHERE s.job_id = gone.id
), signals AS (
    DELETE FROM {SIGNAL} AS g USING gone WHERE g.job_id = gone.id
)
SELECT count(*) FROM gone
"""

# Dry run of the above: how many rows would go. Reads only, takes no row locks.
JOB_PRUNE_COUNT = f"""
SELECT count(*) FROM {JOB}
 WHERE finished_at IS NOT NULL
   AND finished_at < now() - make_interval(secs => %(older_than)s)
   AND status = %(status)s
   AND {_NOT_NEEDED}
"""
