"""The SQL function ``pgjobs_enqueue``: enqueue from SQL (pg_cron, triggers, psql)."""

from __future__ import annotations

from django_pgjobs.db.job_insert import UNIQUE_KEY_HELD
from django_pgjobs.db.tables import JOB, NOTIFY_CHANNEL
from django_pgjobs.states import PRIORITY_MAX, PRIORITY_MIN, JobStatus
from django_pgjobs.support.validation import MAX_DELAY
from django_pgjobs.support.validation import MAX_DEPTH as MAX_JSON_DEPTH

# pgjobs_enqueue(task, args, kwargs, queue, priority, run_at, idempotency_key,
# max_attempts, debounce, debounce_key, max_wait, keep, fair_key): enqueue from SQL
# (pg_cron, triggers, psql). Validates its input
# with errors naming the argument; a NULL argument leaves the column out of the
# INSERT so the table's own defaults apply (the same db_defaults as Python).
# Same statement shape as JOB_INSERT: ON CONFLICT on the partial unique key index
# (waits only for a concurrent inserter of the same key), NOTIFY at commit.
# Returns the new job's id, or NULL when a job with that key already exists.
#
# The migrations run this text (it is the only one). The function and the table it
# writes are schema-qualified with the jobs table's own schema and the function runs
# with a pinned search_path, so a caller with another search_path (pg_cron, a
# trigger, a hostile session) gets the same behaviour; arguments are bounded like the
# Python enqueue's (size from the setting pgjobs.max_args_bytes, default 1 MiB;
# nesting; huge numbers).
# The statement is a DO block that finds the table's schema and creates the
# function in it; @SCHEMA@ is that schema as an identifier, @SCHEMA_LITERAL@ the
# same text escaped for use inside a string literal of the body.
# A list or object nested deeper than validation.MAX_DEPTH inside one argument.
_TOO_DEEP = (
    f'strict $.**{{{MAX_JSON_DEPTH + 1} to last}} ? (@.type() == "array" || @.type() == "object")'
)


# The unique index's predicate inside a string literal of the function's body.
_HELD_IN_LITERAL = UNIQUE_KEY_HELD.replace("'", "''")

# pgjobs_enqueue(debounce => ...): the debounced enqueue of debounce.py, the same key
# text ("pending:<task>:<key>") and the same upsert as db/job_insert.py's JOB_DEBOUNCE,
# so enqueues from SQL and from Python meet on one job. Returns the job's id, inserted
# or moved on (or the id of a blocked workflow job that holds the key).
_DEBOUNCED = f"""    IF debounce < interval '0' OR debounce > interval '{MAX_DELAY.days} days' THEN
        RAISE EXCEPTION 'pgjobs_enqueue: debounce must be from 0 seconds to {MAX_DELAY.days} days, got %', debounce
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF debounce_key IS NULL OR length(debounce_key) = 0 OR length(debounce_key) > 255 THEN
        RAISE EXCEPTION 'pgjobs_enqueue: debounce needs a debounce_key of 1-255 characters, got %',
            coalesce(quote_literal(left(debounce_key, 300)), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_wait IS NOT NULL AND (max_wait < debounce OR max_wait > interval '{MAX_DELAY.days} days') THEN
        RAISE EXCEPTION 'pgjobs_enqueue: max_wait must be at least debounce (%) and at most {MAX_DELAY.days} days, got %',
            debounce, max_wait USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF keep IS NOT NULL AND keep NOT IN ('latest', 'first') THEN
        RAISE EXCEPTION 'pgjobs_enqueue: keep must be ''latest'' or ''first'', got %', quote_literal(keep)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF idempotency_key IS NOT NULL OR run_at IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobs_enqueue: a debounced job takes no idempotency_key or run_at (its run_at is now + debounce)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    cols := cols || ARRAY['run_at', 'unique_key', 'debounce_until'];
    vals := vals || ARRAY['now() + $9', '$10', 'now() + coalesce($11, interval ''{MAX_DELAY.days} days'')'];
    EXECUTE format(
        'INSERT INTO @SCHEMA_LITERAL@.{JOB} AS j (%s) VALUES (%s) '
        'ON CONFLICT (unique_key) WHERE {_HELD_IN_LITERAL} '
        'DO UPDATE SET run_at = LEAST(GREATEST(j.run_at, EXCLUDED.run_at), j.debounce_until), '
        '  args = CASE WHEN $12 THEN EXCLUDED.args ELSE j.args END, '
        '  kwargs = CASE WHEN $12 THEN EXCLUDED.kwargs ELSE j.kwargs END '
        'WHERE j.status = ''{JobStatus.PENDING}'' AND j.debounce_until IS NOT NULL '
        'RETURNING id, queue',
        array_to_string(cols, ', '), array_to_string(vals, ', '))
    INTO new_id, new_queue
    USING task, args, kwargs, queue, priority, run_at, idempotency_key, max_attempts,
          debounce, 'pending:' || task || ':' || debounce_key, max_wait,
          coalesce(keep, 'latest') = 'latest', fair_key;
    IF new_id IS NULL THEN
        SELECT id INTO new_id FROM @SCHEMA@.{JOB}
         WHERE unique_key = 'pending:' || task || ':' || debounce_key AND {UNIQUE_KEY_HELD};
    ELSE
        PERFORM pg_notify('{NOTIFY_CHANNEL}', new_queue);
    END IF;
    RETURN new_id;"""


def _json_argument(name: str, json_type: str, placeholder: str) -> str:
    """The check and the column of ``args`` or ``kwargs`` in ENQUEUE_FUNCTION: the two
    differ only in the name, the JSON type they must have and their placeholder."""
    return f"""    IF {name} IS NOT NULL THEN
        IF jsonb_typeof({name}) <> '{json_type}' THEN
            RAISE EXCEPTION 'pgjobs_enqueue: {name} must be a JSON {json_type}, got %', left({name}::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || '{name}'::text; vals := vals || '{placeholder}'::text;
    END IF;"""


# The head of a DO block that creates objects in the jobs table's schema (the
# workflow trigger's functions use it too: db/workflow_trigger.py).
DO_IN_JOBS_SCHEMA = f"""
DO $do$
DECLARE
    schema_name text := (SELECT n.nspname FROM pg_class c
                           JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE c.oid = '{JOB}'::regclass);
BEGIN"""

ENQUEUE_FUNCTION = f"""{DO_IN_JOBS_SCHEMA}
EXECUTE replace(replace($create$
CREATE OR REPLACE FUNCTION @SCHEMA@.pgjobs_enqueue(
    task text,
    args jsonb DEFAULT NULL,
    kwargs jsonb DEFAULT NULL,
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    debounce interval DEFAULT NULL,
    debounce_key text DEFAULT NULL,
    max_wait interval DEFAULT NULL,
    keep text DEFAULT NULL,
    fair_key text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    cols text[] := ARRAY['task'];
    vals text[] := ARRAY['$1'];
    new_id bigint;
    new_queue text;
    max_bytes bigint := coalesce(
        nullif(current_setting('pgjobs.max_args_bytes', true), '')::bigint, 1048576);
    size bigint := coalesce(octet_length(args::text), 0) + coalesce(octet_length(kwargs::text), 0);
BEGIN
    IF task IS NULL OR length(task) = 0 OR length(task) > 255 THEN
        RAISE EXCEPTION 'pgjobs_enqueue: task must be a registered task name of 1-255 characters, got %',
            coalesce(quote_literal(task), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF size > max_bytes THEN
        RAISE EXCEPTION 'pgjobs_enqueue: args and kwargs are % bytes as JSON, more than pgjobs.max_args_bytes (%); store large data elsewhere and pass its key',
            size, max_bytes USING ERRCODE = 'program_limit_exceeded';
    END IF;
{_json_argument("args", "array", "$2")}
{_json_argument("kwargs", "object", "$3")}
    -- What Python could not decode again: nesting deeper than {MAX_JSON_DEPTH} levels
    -- inside an argument, numbers of more than about 4,200 digits.
    IF jsonb_path_exists(coalesce(args, '[]'), '{_TOO_DEEP}')
       OR jsonb_path_exists(coalesce(kwargs, '{{}}'), '{_TOO_DEEP}') THEN
        RAISE EXCEPTION 'pgjobs_enqueue: args or kwargs nest lists/objects more than {MAX_JSON_DEPTH} levels deep'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_path_query(
                   coalesce(args, '[]') || jsonb_build_array(coalesce(kwargs, '{{}}')),
                   'strict $.** ? (@.type() == "number")') AS n(v)
                WHERE length(n.v::text) > 4200) THEN
        RAISE EXCEPTION 'pgjobs_enqueue: args or kwargs hold a number of more than 4200 digits; pass it as a string'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF queue IS NOT NULL THEN
        IF length(btrim(queue)) = 0 OR length(queue) > 100 OR queue <> btrim(queue)
           OR strpos(queue, ',') > 0 THEN
            RAISE EXCEPTION 'pgjobs_enqueue: queue must be 1-100 characters without commas or surrounding spaces, got %',
                quote_literal(queue) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'queue'::text; vals := vals || '$4'::text;
    END IF;
    IF priority IS NOT NULL THEN
        IF priority < {PRIORITY_MIN} OR priority > {PRIORITY_MAX} THEN
            RAISE EXCEPTION 'pgjobs_enqueue: priority must be between {PRIORITY_MIN} and {PRIORITY_MAX} (higher runs first), got %',
                priority USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'priority'::text; vals := vals || '$5'::text;
    END IF;
    IF run_at IS NOT NULL THEN
        IF NOT isfinite(run_at) THEN
            RAISE EXCEPTION 'pgjobs_enqueue: run_at must be a finite time, got %', run_at
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'run_at'::text; vals := vals || '$6'::text;
    END IF;
    IF idempotency_key IS NOT NULL THEN
        IF length(idempotency_key) = 0 OR length(idempotency_key) > 255 THEN
            RAISE EXCEPTION 'pgjobs_enqueue: idempotency_key must be 1-255 characters, got %',
                quote_literal(left(idempotency_key, 300)) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'idempotency_key'::text; vals := vals || '$7'::text;
    END IF;
    IF max_attempts IS NOT NULL THEN
        IF max_attempts < 1 OR max_attempts > 1000 THEN
            RAISE EXCEPTION 'pgjobs_enqueue: max_attempts must be from 1 to 1000, got %',
                max_attempts USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'max_attempts'::text; vals := vals || '$8'::text;
    END IF;
    -- The key of the fair claim's rotation, as @job(fair_key=...) stores it; '' is the
    -- turn the jobs of a fair queue without a key of their own share.
    IF fair_key IS NOT NULL THEN
        IF length(fair_key) > 255 THEN
            RAISE EXCEPTION 'pgjobs_enqueue: fair_key must be at most 255 characters, got %',
                quote_literal(left(fair_key, 300)) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'fair_key'::text; vals := vals || '$13'::text;
    END IF;
    IF debounce IS NULL THEN
        IF debounce_key IS NOT NULL OR max_wait IS NOT NULL OR keep IS NOT NULL THEN
            RAISE EXCEPTION 'pgjobs_enqueue: debounce_key, max_wait and keep need debounce (how long to wait)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        EXECUTE format(
            'INSERT INTO @SCHEMA_LITERAL@.{JOB} (%s) VALUES (%s) '
            'ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING '
            'RETURNING id, queue',
            array_to_string(cols, ', '), array_to_string(vals, ', '))
        INTO new_id, new_queue
        USING task, args, kwargs, queue, priority, run_at, idempotency_key, max_attempts,
              debounce, debounce_key, max_wait, keep, fair_key;
        IF new_id IS NOT NULL THEN
            PERFORM pg_notify('{NOTIFY_CHANNEL}', new_queue);
        END IF;
        RETURN new_id;
    END IF;
{_DEBOUNCED}
END
$fn$
$create$, '@SCHEMA_LITERAL@', replace(quote_ident(schema_name), chr(39), chr(39) || chr(39))),
   '@SCHEMA@', quote_ident(schema_name));
END
$do$
"""
