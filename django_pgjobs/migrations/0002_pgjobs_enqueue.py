"""The SQL function pgjobs_enqueue(task, args, kwargs, queue, priority, run_at,
idempotency_key, max_attempts): enqueue from pg_cron schedules, triggers or psql.

It writes the same columns as the Python enqueue (a NULL argument falls back to
the column's default), validates its input, and sends the same wake-up NOTIFY.

Frozen: the SQL text is the one this migration first ran and never
changes (a migration must not import live code). Later versions of the function
come with later migrations (0003_enqueue_function_v2).
"""

from django.db import migrations

ENQUEUE_FUNCTION_V1 = r"""
CREATE OR REPLACE FUNCTION pgjobs_enqueue(
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
AS $fn$
DECLARE
    cols text[] := ARRAY['task'];
    vals text[] := ARRAY['$1'];
    new_id bigint;
    new_queue text;
BEGIN
    IF task IS NULL OR length(task) = 0 OR length(task) > 255 THEN
        RAISE EXCEPTION 'pgjobs_enqueue: task must be a registered task name of 1-255 characters, got %',
            coalesce(quote_literal(task), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF args IS NOT NULL THEN
        IF jsonb_typeof(args) <> 'array' THEN
            RAISE EXCEPTION 'pgjobs_enqueue: args must be a JSON array, got %', args
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'args'::text; vals := vals || '$2'::text;
    END IF;
    IF kwargs IS NOT NULL THEN
        IF jsonb_typeof(kwargs) <> 'object' THEN
            RAISE EXCEPTION 'pgjobs_enqueue: kwargs must be a JSON object, got %', kwargs
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cols := cols || 'kwargs'::text; vals := vals || '$3'::text;
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
                quote_literal(idempotency_key) USING ERRCODE = 'invalid_parameter_value';
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
        'INSERT INTO django_pgjobs_job (%s) VALUES (%s) '
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
"""

ENQUEUE_FUNCTION_DROP = "DROP FUNCTION IF EXISTS pgjobs_enqueue(text, jsonb, jsonb, text, integer, timestamptz, text, integer)"


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0001_initial"),
    ]

    operations = [
        # Lists: executed as single statements (no script splitting inside the $fn$ body).
        migrations.RunSQL([ENQUEUE_FUNCTION_V1], reverse_sql=[ENQUEUE_FUNCTION_DROP]),
    ]
