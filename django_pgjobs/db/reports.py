"""What an operator reads: the status queries behind ``jobs_status`` and the admin
overview, table health, the overview's charts, the worker's liveness file and
``runjobs``' queue hints. All read-only; none takes a row lock."""

from __future__ import annotations

from django_pgjobs.db.error_history import keep_newest
from django_pgjobs.db.rollup import claimed_since, finished_since
from django_pgjobs.db.tables import JOB, QUEUE, WORKER, pending_queues_cte
from django_pgjobs.states import JobStatus

# Live work per queue, exact: pending rows through the claim index, running rows
# through the running index and parked durable jobs ('waiting') through their own
# partial index, one aggregate each, joined per queue. (A single scan WHERE status IN
# ('pending', 'running', 'waiting') cannot use the partial indexes and reads the whole
# table.) Never the history. No locks.
STATUS_ACTIVE = f"""
WITH pending AS (
    SELECT queue, count(*) AS pending, count(*) FILTER (WHERE run_at <= now()) AS due,
           now() - min(run_at) FILTER (WHERE run_at <= now()) AS lag
      FROM {JOB} WHERE status = '{JobStatus.PENDING}'
     GROUP BY queue
), running AS (
    SELECT queue, count(*) AS running,
           count(*) FILTER (WHERE heartbeat_at < now() - make_interval(secs => %(stale_after)s))
               AS stuck
      FROM {JOB} WHERE status = '{JobStatus.RUNNING}'
     GROUP BY queue
), waiting AS (
    SELECT queue, count(*) AS waiting
      FROM {JOB} WHERE status = '{JobStatus.WAITING}'
     GROUP BY queue
)
SELECT queue, COALESCE(p.pending, 0), COALESCE(p.due, 0), COALESCE(r.running, 0),
       COALESCE(r.stuck, 0), p.lag, COALESCE(w.waiting, 0)
  FROM pending AS p FULL JOIN running AS r USING (queue) FULL JOIN waiting AS w USING (queue)
"""

# The start of the minute ``%(window)s`` seconds ago: the windows of the status pages
# and charts begin on a minute, so that the minute rollup (db/rollup.py) answers them.
WINDOW_START = "date_trunc('minute', now() - make_interval(secs => %(window)s))"

# Finished per queue and status since WINDOW_START, with the completions of the last 5
# and 60 whole minutes and the current one so far (throughput; complete only for a
# window of at least an hour): the minute rollup plus the jobs finished since its mark
# (finished_at index), so its cost follows the number of minutes and queues, not
# throughput or history. No locks.
STATUS_FINISHED = f"""
SELECT queue, status, sum(n)::bigint,
       COALESCE(sum(n) FILTER (
           WHERE minute >= date_trunc('minute', now()) - interval '5 minutes'), 0)::bigint,
       COALESCE(sum(n) FILTER (
           WHERE minute >= date_trunc('minute', now()) - interval '60 minutes'), 0)::bigint
  FROM ({finished_since(WINDOW_START)}) AS f
 GROUP BY queue, status
"""

# Dead-lettered since WINDOW_START: the minute rollup's dead rows plus the live tail.
# No locks.
STATUS_DEAD_RECENT = f"""
SELECT COALESCE(sum(n), 0)::bigint FROM ({finished_since(WINDOW_START, status=JobStatus.DEAD)}) AS f
"""

# Vacuum health of a table and, for the jobs table, the planner's statistics of the
# status column (table-wide totals per status without a scan): statistics views
# and catalog only, plus the server's clock. No locks.
TABLE_HEALTH = """
SELECT now(), c.relname, c.reltuples::float8, pg_total_relation_size(c.oid),
       COALESCE(s.n_live_tup, 0), COALESCE(s.n_dead_tup, 0), s.last_autovacuum,
       s.last_vacuum, s.last_autoanalyze, COALESCE(s.autovacuum_count, 0), c.reloptions,
       (SELECT most_common_vals::text FROM pg_stats
         WHERE schemaname = n.nspname AND tablename = c.relname AND attname = 'status'),
       (SELECT most_common_freqs FROM pg_stats
         WHERE schemaname = n.nspname AND tablename = c.relname AND attname = 'status'),
       -- autovacuum off (server-wide, or for this table) means nothing reclaims
       -- the two dead tuples every job leaves behind
       current_setting('autovacuum')::bool
         AND NOT COALESCE('autovacuum_enabled=false' = ANY(c.reloptions), false)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.oid = %(table)s::regclass
"""

# PostgreSQL's estimate of a table's rows (-1: never vacuumed or analyzed). No scan.
TABLE_ESTIMATE = "SELECT reltuples::bigint FROM pg_class WHERE oid = %(table)s::regclass"

# Size of a relation, e.g. the claim index: it should stay small (pending rows
# only); growth without a backlog means bloat that vacuum is not reclaiming.
INDEX_SIZE = "SELECT pg_relation_size(%(index)s::regclass)"

# Registered workers, most recently seen first (LIMIT NULL: all of them), with
# the time since each was last seen (live: within STALE_AFTER).
STATUS_WORKERS = f"""
SELECT id, host, pid, queues, concurrency, started_at, last_seen, now() - last_seen,
       degraded
  FROM {WORKER} ORDER BY last_seen DESC LIMIT %(limit)s
"""

# Queues that have pending or running rows. Pending: the loose index scan of the
# claim index (one probe per queue, as in JOB_CLAIM_ALL). Running: the running
# index, as many rows as jobs in flight. Never the history. No locks.
ACTIVE_QUEUES = f"""
WITH RECURSIVE {pending_queues_cte()}
SELECT name FROM qs WHERE name IS NOT NULL
UNION
SELECT DISTINCT queue FROM {JOB} WHERE status = '{JobStatus.RUNNING}'
LIMIT 1000
"""

# Every (queue, fair key) pair of pending jobs in index order: a loose index scan of
# the fair index, one descent per pair (one, finding nothing, when no job has a key).
# The statements below cap how many pairs they read. (The claim walks one queue's
# keys from its cursor instead: claim/fair.py.)
_FAIR_PAIRS = f"""fk(queue, key) AS (
    (SELECT queue, fair_key FROM {JOB}
      WHERE status = '{JobStatus.PENDING}' AND fair_key IS NOT NULL
      ORDER BY queue, fair_key LIMIT 1)
    UNION ALL
    SELECT n.queue, n.fair_key FROM fk CROSS JOIN LATERAL (
        SELECT queue, fair_key FROM {JOB}
         WHERE status = '{JobStatus.PENDING}' AND fair_key IS NOT NULL
           AND (queue, fair_key) > (fk.queue, fk.key)
         ORDER BY queue, fair_key LIMIT 1) AS n
)"""

# The fair keys of pending jobs, for the job list's filter: a loose index scan of the
# fair index over (queue, fair_key), one descent per pair, at most 200 pairs. Empty
# (one descent) when no job has a fair key. No locks.
PENDING_FAIR_KEYS = f"""
WITH RECURSIVE {_FAIR_PAIRS}
SELECT DISTINCT key FROM (SELECT key FROM fk LIMIT 200) AS first_keys
"""

# The busiest fair keys of one queue, for its admin page: the keys of its pending jobs
# by a loose index scan of the fair index (one descent a key, the first
# %(keys)s keys in key order), each key's pending jobs counted through the same index
# up to %(cap)s (a key with more shows as that many or more), the %(top)s largest
# counts. Bounded whatever the backlog: at most keys descents and keys x cap index
# entries. The key is bounded on both sides (>= and <=, not =) so that statistics
# which saw one key still plan the count on the fair index (see claim/fair.py).
# No locks.
FAIR_KEYS_BUSIEST = f"""
WITH RECURSIVE fk(key) AS (
    (SELECT fair_key FROM {JOB}
      WHERE status = '{JobStatus.PENDING}' AND fair_key IS NOT NULL AND queue = %(queue)s
      ORDER BY fair_key LIMIT 1)
    UNION ALL
    SELECT (SELECT fair_key FROM {JOB}
             WHERE status = '{JobStatus.PENDING}' AND fair_key IS NOT NULL
               AND queue = %(queue)s AND fair_key > fk.key
             ORDER BY fair_key LIMIT 1)
      FROM fk WHERE fk.key IS NOT NULL
)
SELECT k.key, c.pending
  FROM (SELECT key FROM fk WHERE key IS NOT NULL LIMIT %(keys)s) AS k
  CROSS JOIN LATERAL (
    SELECT count(*) AS pending FROM (
        SELECT 1 FROM {JOB} j
         WHERE j.status = '{JobStatus.PENDING}' AND j.fair_key IS NOT NULL
           AND j.queue = %(queue)s AND j.fair_key >= k.key AND j.fair_key <= k.key
         LIMIT %(cap)s) AS capped) AS c
 ORDER BY c.pending DESC, k.key
 LIMIT %(top)s
"""

# Fair shares, per queue: among the fair keys with a due job and none running, the
# longest any has waited (the age of its next job's run_at, in claim order). A key
# being served has a running job, so a large backlog served in turn does not count;
# a key passed over does. Every (queue, key) pair of pending jobs by a loose index
# scan of the fair index (at most 10,000), one descent each for its next due job;
# the running keys through the running index (jobs in flight only). No locks.
FAIR_WAIT = f"""
WITH RECURSIVE {_FAIR_PAIRS}, served AS MATERIALIZED (
    SELECT DISTINCT queue, fair_key FROM {JOB}
     WHERE status = '{JobStatus.RUNNING}' AND fair_key IS NOT NULL
)
SELECT k.queue, extract(epoch FROM now() - min(h.run_at))::float8
  FROM (SELECT queue, key FROM fk LIMIT 10000) AS k
  CROSS JOIN LATERAL (
    SELECT j.run_at FROM {JOB} j
     WHERE j.status = '{JobStatus.PENDING}' AND j.queue = k.queue
       AND j.fair_key >= k.key AND j.fair_key <= k.key AND j.run_at <= now()
     ORDER BY j.fair_key, j.priority DESC, j.run_at, j.id
     LIMIT 1) AS h
 WHERE NOT EXISTS (SELECT 1 FROM served s WHERE s.queue = k.queue AND s.fair_key = k.key)
 GROUP BY k.queue
"""

# The overview's charts (health/activity.py: why lag is computed this way).
# Finished jobs per minute and status since WINDOW_START: the minute rollup plus the
# live tail (db/rollup.py). No locks.
FINISHED_PER_MINUTE = f"""
SELECT minute, status, sum(n)::bigint
  FROM ({finished_since(WINDOW_START)}) AS f
 GROUP BY 1, 2
 LIMIT 1000
"""

# Per queue and minute of claim since WINDOW_START: the earliest run_at of the jobs
# claimed in that minute that had waited (see health/activity.py's docstring): the
# minute rollup, the live tail of finished jobs and the running ones (running index);
# never the history. No locks.
CLAIMED_PER_MINUTE = f"""
SELECT queue, minute, min(earliest)
  FROM ({claimed_since(WINDOW_START)}) AS c (queue, minute, earliest)
 GROUP BY 1, 2
 LIMIT 20000
"""

# Pending jobs per queue, for runjobs' hints (read from the partial claim index).
PENDING_PER_QUEUE = (
    f"SELECT queue, count(*) FROM {JOB} WHERE status = '{JobStatus.PENDING}' "
    "GROUP BY queue ORDER BY queue"
)

# The queues that have a row in the queue table (limits, pauses): they keep their own
# label in the worker's metrics (health/metrics.py folds the rest into "other"). The
# table holds what people configured, a few rows; the LIMIT bounds a runaway. No locks.
QUEUE_NAMES = f"SELECT name FROM {QUEUE} ORDER BY name LIMIT 1000"

# A job's error history on its admin page: how many entries (a row edited by hand may
# hold something else than an array), and the %s newest.
ERRORS_TOTAL = (
    "jsonb_array_length(CASE WHEN jsonb_typeof(errors) = 'array' THEN errors ELSE '[]'::jsonb END)"
)
ERRORS_NEWEST = keep_newest("errors", keep="%s")
