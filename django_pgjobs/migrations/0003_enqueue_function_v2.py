"""pgjobs_enqueue, version 2: schema-qualified, with a pinned search_path, and
bounding its arguments like the Python enqueue.

* The function is created in the jobs table's own schema and inserts into that
  schema's table by name, and it runs with ``search_path = pg_catalog, pg_temp``:
  a caller whose search_path differs (pg_cron, a trigger, another application's
  session) writes the same table, and nobody can shadow a function it calls.
* Arguments larger than the setting ``pgjobs.max_args_bytes`` (default 1 MiB, the
  default of ``PGJOBS["MAX_ARGS_BYTES"]``), nested deeper than 200 levels, or
  holding numbers Python could not read back are refused with a clear error.

Frozen: the SQL text below is what this migration runs, whatever later code says
(``tests/test_migrations_frozen.py`` checks that ``sql.ENQUEUE_FUNCTION``, the
code's current expectation, equals the newest migration's text).
"""

from importlib import import_module

from django.db import migrations

ENQUEUE_FUNCTION_V2 = r"""
DO $do$
DECLARE
    schema_name text := (SELECT n.nspname FROM pg_class c
                           JOIN pg_namespace n ON n.oid = c.relnamespace
                          WHERE c.oid = 'django_pgjobs_job'::regclass);
BEGIN
EXECUTE replace(replace($create$
CREATE OR REPLACE FUNCTION @SCHEMA@.pgjobs_enqueue(
    task text,
    args jsonb DEFAULT NULL,
    kwargs jsonb DEFAULT NULL,
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL
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
    IF args IS NOT NULL THEN
        IF jsonb_typeof(args) <> 'array' THEN
            RAISE EXCEPTION 'pgjobs_enqueue: args must be a JSON array, got %', left(args::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'args'::text; vals := vals || '$2'::text;
    END IF;
    IF kwargs IS NOT NULL THEN
        IF jsonb_typeof(kwargs) <> 'object' THEN
            RAISE EXCEPTION 'pgjobs_enqueue: kwargs must be a JSON object, got %', left(kwargs::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'kwargs'::text; vals := vals || '$3'::text;
    END IF;
    -- What Python could not decode again: nesting deeper than 200 levels
    -- inside an argument, numbers of more than about 4,200 digits.
    IF jsonb_path_exists(coalesce(args, '[]'), 'strict $.**{201 to last} ? (@.type() == "array" || @.type() == "object")')
       OR jsonb_path_exists(coalesce(kwargs, '{}'), 'strict $.**{201 to last} ? (@.type() == "array" || @.type() == "object")') THEN
        RAISE EXCEPTION 'pgjobs_enqueue: args or kwargs nest lists/objects more than 200 levels deep'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_path_query(
                   coalesce(args, '[]') || jsonb_build_array(coalesce(kwargs, '{}')),
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
        IF priority < -100 OR priority > 100 THEN
            RAISE EXCEPTION 'pgjobs_enqueue: priority must be between -100 and 100 (higher runs first), got %',
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
    EXECUTE format(
        'INSERT INTO @SCHEMA_LITERAL@.django_pgjobs_job (%s) VALUES (%s) '
        'ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING '
        'RETURNING id, queue',
        array_to_string(cols, ', '), array_to_string(vals, ', '))
    INTO new_id, new_queue
    USING task, args, kwargs, queue, priority, run_at, idempotency_key, max_attempts;
    IF new_id IS NOT NULL THEN
        PERFORM pg_notify('pgjobs', new_queue);
    END IF;
    RETURN new_id;
END
$fn$
$create$, '@SCHEMA_LITERAL@', replace(quote_ident(schema_name), chr(39), chr(39) || chr(39))),
   '@SCHEMA@', quote_ident(schema_name));
END
$do$
"""

# Going back re-creates version 1 exactly as migration 0002 did (it is frozen too).
_v1 = import_module("django_pgjobs.migrations.0002_pgjobs_enqueue")


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0002_pgjobs_enqueue"),
    ]

    operations = [
        migrations.RunSQL(
            [ENQUEUE_FUNCTION_V2], reverse_sql=[_v1.ENQUEUE_FUNCTION_DROP, _v1.ENQUEUE_FUNCTION_V1]
        ),
    ]
