-- LonnyMQ periodic (cron) messages, declared and fired by workers.
--
-- One row per schedule (the cron table, baseline migration). Workers compute the schedule's
-- ticks (the schedule text is parsed in Python) and call cron_fire(name, tick) for each tick
-- that came due; a compare-and-set on last_tick_ms in the same transaction as the send sends
-- every tick exactly once across any number of workers.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Declare a schedule, or update its definition. A new schedule starts at p_now: ticks before
-- its creation are not sent. Updating keeps last_tick_ms and enabled, so re-declaring the same
-- schedule on every worker start never re-sends a tick. Returns 'created', 'updated' or
-- 'unchanged'.
CREATE OR REPLACE FUNCTION {schema}.cron_upsert(
    p_name             text,
    p_schedule         text,
    p_queue            text,
    p_payload          bytea,
    p_kind             text    DEFAULT NULL,
    p_content_type     text    DEFAULT NULL,
    p_headers          jsonb   DEFAULT NULL,
    p_priority         smallint DEFAULT 0,
    p_misfire_grace_ms bigint  DEFAULT 60000,
    p_source           text    DEFAULT 'code',
    p_now              bigint  DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := {schema}._now(p_now);
BEGIN
    PERFORM {schema}._queue(p_queue);  -- the queue must exist (LQ001 otherwise)
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,199}}$' THEN
        PERFORM {schema}._invalid(format('invalid schedule name %s: use 1-200 of A-Z a-z 0-9 _ . : -',
                                         quote_nullable(p_name)));
    END IF;
    IF p_payload IS NULL THEN
        PERFORM {schema}._invalid('a schedule needs a payload');
    END IF;
    IF p_priority IS NULL OR p_priority NOT BETWEEN -100 AND 100 THEN
        PERFORM {schema}._invalid('priority must be in -100..100');
    END IF;
    IF p_misfire_grace_ms IS NULL OR p_misfire_grace_ms < 0 THEN
        PERFORM {schema}._invalid('misfire_grace_ms must be >= 0');
    END IF;
    IF p_source NOT IN ('code', 'cli') THEN
        PERFORM {schema}._invalid('source must be code or cli');
    END IF;
    INSERT INTO {schema}.cron (name, schedule, queue, kind, content_type, headers, priority,
                               payload, misfire_grace_ms, source, last_tick_ms)
    VALUES (p_name, p_schedule, p_queue, p_kind, p_content_type, p_headers, p_priority,
            p_payload, p_misfire_grace_ms, p_source, v_now)
    ON CONFLICT (name) DO NOTHING;
    IF FOUND THEN
        RETURN 'created';
    END IF;
    UPDATE {schema}.cron c
       SET schedule = p_schedule, queue = p_queue, kind = p_kind, content_type = p_content_type,
           headers = p_headers, priority = p_priority, payload = p_payload,
           misfire_grace_ms = p_misfire_grace_ms, source = p_source, updated_at = now()
     WHERE c.name = p_name
       AND (c.schedule, c.queue, c.kind, c.content_type, c.headers, c.priority, c.payload,
            c.misfire_grace_ms, c.source)
           IS DISTINCT FROM
           (p_schedule, p_queue, p_kind, p_content_type, p_headers, p_priority, p_payload,
            p_misfire_grace_ms, p_source);
    RETURN CASE WHEN FOUND THEN 'updated' ELSE 'unchanged' END;
END $$;

-- Delete schedule p_name. Returns whether it existed. Writes cron.
CREATE OR REPLACE FUNCTION {schema}.cron_delete(p_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM {schema}.cron WHERE name = p_name;
    RETURN FOUND;
END $$;

-- Pause (false) or resume (true) schedule p_name. Returns whether it exists. Writes cron.
CREATE OR REPLACE FUNCTION {schema}.cron_set_enabled(p_name text, p_enabled boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE {schema}.cron SET enabled = p_enabled, updated_at = now() WHERE name = p_name;
    RETURN FOUND;
END $$;

-- Every schedule with the database clock, so workers compute ticks on one clock.
CREATE OR REPLACE FUNCTION {schema}.cron_list()
RETURNS TABLE (
    name text, schedule text, queue text, kind text, enabled boolean, source text,
    misfire_grace_ms bigint, last_tick_ms bigint, last_fired_ms bigint, last_message_id bigint,
    db_now_ms bigint
)
LANGUAGE sql VOLATILE AS $$
    SELECT c.name, c.schedule, c.queue, c.kind, c.enabled, c.source, c.misfire_grace_ms,
           c.last_tick_ms, c.last_fired_ms, c.last_message_id, {schema}.now_ms()
      FROM {schema}.cron c
     ORDER BY c.name
$$;

-- Send the message of tick p_tick_ms of schedule p_name, unless this tick or a later one was
-- already sent, the tick is still in the future, or it is older than the misfire grace. Returns
-- the message id, or NULL when nothing was sent. The tick is recorded in the same transaction as
-- the send: if the send fails, the tick stays unsent. The message carries the header
-- {{"lonnymq_cron": {{"name": ..., "tick": <epoch ms>}}}}.
CREATE OR REPLACE FUNCTION {schema}.cron_fire(p_name text, p_tick_ms bigint, p_now bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := {schema}._now(p_now);
    c     {schema}.cron;
    v_id  bigint;
BEGIN
    UPDATE {schema}.cron
       SET last_tick_ms = p_tick_ms, last_fired_ms = v_now
     WHERE name = p_name AND enabled AND last_tick_ms < p_tick_ms
       AND p_tick_ms <= v_now AND p_tick_ms >= v_now - misfire_grace_ms
    RETURNING * INTO c;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT s.id INTO v_id
      FROM {schema}.send_batch(
               c.queue, ARRAY[c.payload], ARRAY[c.kind], ARRAY[c.content_type],
               ARRAY[coalesce(c.headers, '{{}}'::jsonb)
                     || jsonb_build_object('lonnymq_cron',
                                           jsonb_build_object('name', c.name, 'tick', p_tick_ms))],
               NULL, NULL, ARRAY[c.priority], NULL, NULL, 'ignore', v_now) s;
    UPDATE {schema}.cron SET last_message_id = v_id WHERE name = p_name;
    RETURN v_id;
END $$;
