-- Variants of send()'s result shape, made from main's send() (a530614) in schema tree_x of
-- benchmarks/statement_instructions.py (docs/benchmarks.md, "send() returns one value"): v0 a copy,
-- v1 OUT parameters (RETURNS record), v2 a named composite type, v3 a bigint (the id alone).
CREATE TYPE tree_x.sent_row AS (id bigint, outcome text);
CREATE OR REPLACE FUNCTION tree_x.send_v0(
    p_queue        text,
    p_payload      bytea,
    p_content_type text     DEFAULT NULL,
    p_kind         text     DEFAULT NULL,
    p_headers      jsonb    DEFAULT NULL,
    p_at_ms        bigint   DEFAULT NULL,
    p_delay_ms     bigint   DEFAULT NULL,
    p_priority     smallint DEFAULT 0,
    p_key          text     DEFAULT NULL,
    p_channel      text     DEFAULT NULL,
    p_on_conflict  text     DEFAULT 'ignore',
    p_send_key     uuid     DEFAULT NULL,
    p_now          bigint   DEFAULT NULL
) RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
    v_now  bigint;
    v_at   bigint;
    v_gen  bigint;
BEGIN
    IF p_now IS NULL THEN
        v_now := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    ELSE
        v_now := tree_x._now(p_now);
    END IF;
    -- Argument checks that need no queue, inline: a failing one takes send_batch's path, which
    -- raises the error.
    IF p_key IS NULL AND p_channel IS NULL AND p_payload IS NOT NULL AND p_priority BETWEEN -100 AND 100
       AND (p_delay_ms IS NULL OR p_delay_ms >= 0)
       AND (p_headers IS NULL OR jsonb_typeof(p_headers) = 'object')
       AND p_on_conflict IN ('ignore', 'replace', 'error') THEN
        v_at := coalesce(p_at_ms, v_now + coalesce(p_delay_ms, 0));
        v_gen := pg_sequence_last_value('tree_x.message_gen_seq');  -- _gen_write()'s first read
        IF p_send_key IS NULL THEN
            -- One INSERT ... SELECT from the queue's row, found by its name's unique index,
            -- whose filter (_send_ok, inlined) checks the payload's size, holds the generation,
            -- wakes a waiting consumer and re-reads the generation, in that order. No subquery
            -- for the locks, no CTE for the queue (a CTE scan and its materialisation), no
            -- explicit id (nextval() in the SELECT list would keep it a subquery scan of its
            -- own: the identity default takes the same sequence).
            RETURN QUERY
                WITH ins AS (
                    INSERT INTO tree_x.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT x.id, v_gen,
                           tree_x._dequeue_at(v_at, p_priority, x.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM tree_x.queue x
                     WHERE x.name = p_queue
                       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id, 'created'::text FROM ins;
        ELSE
            -- The same (keep them in step), the key's send_key row first: the message's id
            -- comes from the sequence first (in q, which both inserts read), so that the key
            -- row can hold it; a key the queue has recorded (or that a running call holds: the
            -- insert waits for it) inserts nothing.
            RETURN QUERY
                WITH q AS (
                    SELECT x.id, x.priority_step_ms, nextval('tree_x.message_id_seq') AS mid
                      FROM tree_x.queue x
                     WHERE x.name = p_queue
                       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                ), k AS (
                    INSERT INTO tree_x.send_key AS k (queue_id, key, at_ms, ids)
                    SELECT q.id, p_send_key, v_now, ARRAY[q.mid] FROM q
                    ON CONFLICT (queue_id, key) DO NOTHING
                    RETURNING k.queue_id
                ), ins AS (
                    INSERT INTO tree_x.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT q.id, q.mid, v_gen,
                           tree_x._dequeue_at(v_at, p_priority, q.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM q JOIN k ON k.queue_id = q.id
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id, 'created'::text FROM ins;
        END IF;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    SELECT s.id, s.outcome
      FROM tree_x.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],
                               ARRAY[p_headers], ARRAY[p_at_ms], ARRAY[p_delay_ms], ARRAY[p_priority],
                               ARRAY[p_key], ARRAY[p_channel], p_on_conflict, p_now, p_send_key) s;
END $$;


ALTER FUNCTION tree_x.send_v0 SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION tree_x.send_v1(
    p_queue        text,
    p_payload      bytea,
    p_content_type text     DEFAULT NULL,
    p_kind         text     DEFAULT NULL,
    p_headers      jsonb    DEFAULT NULL,
    p_at_ms        bigint   DEFAULT NULL,
    p_delay_ms     bigint   DEFAULT NULL,
    p_priority     smallint DEFAULT 0,
    p_key          text     DEFAULT NULL,
    p_channel      text     DEFAULT NULL,
    p_on_conflict  text     DEFAULT 'ignore',
    p_send_key     uuid     DEFAULT NULL,
    p_now          bigint   DEFAULT NULL,
    OUT id bigint, OUT outcome text
) RETURNS record
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
    v_now  bigint;
    v_at   bigint;
    v_gen  bigint;
BEGIN
    IF p_now IS NULL THEN
        v_now := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    ELSE
        v_now := tree_x._now(p_now);
    END IF;
    -- Argument checks that need no queue, inline: a failing one takes send_batch's path, which
    -- raises the error.
    IF p_key IS NULL AND p_channel IS NULL AND p_payload IS NOT NULL AND p_priority BETWEEN -100 AND 100
       AND (p_delay_ms IS NULL OR p_delay_ms >= 0)
       AND (p_headers IS NULL OR jsonb_typeof(p_headers) = 'object')
       AND p_on_conflict IN ('ignore', 'replace', 'error') THEN
        v_at := coalesce(p_at_ms, v_now + coalesce(p_delay_ms, 0));
        v_gen := pg_sequence_last_value('tree_x.message_gen_seq');  -- _gen_write()'s first read
        IF p_send_key IS NULL THEN
            -- One INSERT ... SELECT from the queue's row, found by its name's unique index,
            -- whose filter (_send_ok, inlined) checks the payload's size, holds the generation,
            -- wakes a waiting consumer and re-reads the generation, in that order. No subquery
            -- for the locks, no CTE for the queue (a CTE scan and its materialisation), no
            -- explicit id (nextval() in the SELECT list would keep it a subquery scan of its
            -- own: the identity default takes the same sequence).
                WITH ins AS (
                    INSERT INTO tree_x.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT x.id, v_gen,
                           tree_x._dequeue_at(v_at, p_priority, x.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM tree_x.queue x
                     WHERE x.name = p_queue
                       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id INTO send_v1.id FROM ins;
        ELSE
            -- The same (keep them in step), the key's send_key row first: the message's id
            -- comes from the sequence first (in q, which both inserts read), so that the key
            -- row can hold it; a key the queue has recorded (or that a running call holds: the
            -- insert waits for it) inserts nothing.
                WITH q AS (
                    SELECT x.id, x.priority_step_ms, nextval('tree_x.message_id_seq') AS mid
                      FROM tree_x.queue x
                     WHERE x.name = p_queue
                       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                ), k AS (
                    INSERT INTO tree_x.send_key AS k (queue_id, key, at_ms, ids)
                    SELECT q.id, p_send_key, v_now, ARRAY[q.mid] FROM q
                    ON CONFLICT (queue_id, key) DO NOTHING
                    RETURNING k.queue_id
                ), ins AS (
                    INSERT INTO tree_x.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT q.id, q.mid, v_gen,
                           tree_x._dequeue_at(v_at, p_priority, q.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM q JOIN k ON k.queue_id = q.id
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id INTO send_v1.id FROM ins;
        END IF;
        IF FOUND THEN
            outcome := 'created';
            RETURN;
        END IF;
    END IF;
    SELECT s.id, s.outcome INTO send_v1.id, send_v1.outcome
      FROM tree_x.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],
                               ARRAY[p_headers], ARRAY[p_at_ms], ARRAY[p_delay_ms], ARRAY[p_priority],
                               ARRAY[p_key], ARRAY[p_channel], p_on_conflict, p_now, p_send_key) s;
END $$;


ALTER FUNCTION tree_x.send_v1 SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION tree_x.send_v2(
    p_queue        text,
    p_payload      bytea,
    p_content_type text     DEFAULT NULL,
    p_kind         text     DEFAULT NULL,
    p_headers      jsonb    DEFAULT NULL,
    p_at_ms        bigint   DEFAULT NULL,
    p_delay_ms     bigint   DEFAULT NULL,
    p_priority     smallint DEFAULT 0,
    p_key          text     DEFAULT NULL,
    p_channel      text     DEFAULT NULL,
    p_on_conflict  text     DEFAULT 'ignore',
    p_send_key     uuid     DEFAULT NULL,
    p_now          bigint   DEFAULT NULL
) RETURNS tree_x.sent_row
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
    r tree_x.sent_row;
    v_now  bigint;
    v_at   bigint;
    v_gen  bigint;
BEGIN
    IF p_now IS NULL THEN
        v_now := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    ELSE
        v_now := tree_x._now(p_now);
    END IF;
    -- Argument checks that need no queue, inline: a failing one takes send_batch's path, which
    -- raises the error.
    IF p_key IS NULL AND p_channel IS NULL AND p_payload IS NOT NULL AND p_priority BETWEEN -100 AND 100
       AND (p_delay_ms IS NULL OR p_delay_ms >= 0)
       AND (p_headers IS NULL OR jsonb_typeof(p_headers) = 'object')
       AND p_on_conflict IN ('ignore', 'replace', 'error') THEN
        v_at := coalesce(p_at_ms, v_now + coalesce(p_delay_ms, 0));
        v_gen := pg_sequence_last_value('tree_x.message_gen_seq');  -- _gen_write()'s first read
        IF p_send_key IS NULL THEN
            -- One INSERT ... SELECT from the queue's row, found by its name's unique index,
            -- whose filter (_send_ok, inlined) checks the payload's size, holds the generation,
            -- wakes a waiting consumer and re-reads the generation, in that order. No subquery
            -- for the locks, no CTE for the queue (a CTE scan and its materialisation), no
            -- explicit id (nextval() in the SELECT list would keep it a subquery scan of its
            -- own: the identity default takes the same sequence).
                WITH ins AS (
                    INSERT INTO tree_x.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT x.id, v_gen,
                           tree_x._dequeue_at(v_at, p_priority, x.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM tree_x.queue x
                     WHERE x.name = p_queue
                       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id INTO r.id FROM ins;
        ELSE
            -- The same (keep them in step), the key's send_key row first: the message's id
            -- comes from the sequence first (in q, which both inserts read), so that the key
            -- row can hold it; a key the queue has recorded (or that a running call holds: the
            -- insert waits for it) inserts nothing.
                WITH q AS (
                    SELECT x.id, x.priority_step_ms, nextval('tree_x.message_id_seq') AS mid
                      FROM tree_x.queue x
                     WHERE x.name = p_queue
                       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                ), k AS (
                    INSERT INTO tree_x.send_key AS k (queue_id, key, at_ms, ids)
                    SELECT q.id, p_send_key, v_now, ARRAY[q.mid] FROM q
                    ON CONFLICT (queue_id, key) DO NOTHING
                    RETURNING k.queue_id
                ), ins AS (
                    INSERT INTO tree_x.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT q.id, q.mid, v_gen,
                           tree_x._dequeue_at(v_at, p_priority, q.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM q JOIN k ON k.queue_id = q.id
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id INTO r.id FROM ins;
        END IF;
        IF FOUND THEN
            r.outcome := 'created';
            RETURN r;
        END IF;
    END IF;
    SELECT s.id, s.outcome INTO r.id, r.outcome
      FROM tree_x.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],
                               ARRAY[p_headers], ARRAY[p_at_ms], ARRAY[p_delay_ms], ARRAY[p_priority],
                               ARRAY[p_key], ARRAY[p_channel], p_on_conflict, p_now, p_send_key) s;
    RETURN r;
END $$;


ALTER FUNCTION tree_x.send_v2 SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION tree_x.send_v3(
    p_queue        text,
    p_payload      bytea,
    p_content_type text     DEFAULT NULL,
    p_kind         text     DEFAULT NULL,
    p_headers      jsonb    DEFAULT NULL,
    p_at_ms        bigint   DEFAULT NULL,
    p_delay_ms     bigint   DEFAULT NULL,
    p_priority     smallint DEFAULT 0,
    p_key          text     DEFAULT NULL,
    p_channel      text     DEFAULT NULL,
    p_on_conflict  text     DEFAULT 'ignore',
    p_send_key     uuid     DEFAULT NULL,
    p_now          bigint   DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
    r tree_x.sent_row;
    v_now  bigint;
    v_at   bigint;
    v_gen  bigint;
BEGIN
    IF p_now IS NULL THEN
        v_now := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    ELSE
        v_now := tree_x._now(p_now);
    END IF;
    -- Argument checks that need no queue, inline: a failing one takes send_batch's path, which
    -- raises the error.
    IF p_key IS NULL AND p_channel IS NULL AND p_payload IS NOT NULL AND p_priority BETWEEN -100 AND 100
       AND (p_delay_ms IS NULL OR p_delay_ms >= 0)
       AND (p_headers IS NULL OR jsonb_typeof(p_headers) = 'object')
       AND p_on_conflict IN ('ignore', 'replace', 'error') THEN
        v_at := coalesce(p_at_ms, v_now + coalesce(p_delay_ms, 0));
        v_gen := pg_sequence_last_value('tree_x.message_gen_seq');  -- _gen_write()'s first read
        IF p_send_key IS NULL THEN
            -- One INSERT ... SELECT from the queue's row, found by its name's unique index,
            -- whose filter (_send_ok, inlined) checks the payload's size, holds the generation,
            -- wakes a waiting consumer and re-reads the generation, in that order. No subquery
            -- for the locks, no CTE for the queue (a CTE scan and its materialisation), no
            -- explicit id (nextval() in the SELECT list would keep it a subquery scan of its
            -- own: the identity default takes the same sequence).
                WITH ins AS (
                    INSERT INTO tree_x.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT x.id, v_gen,
                           tree_x._dequeue_at(v_at, p_priority, x.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM tree_x.queue x
                     WHERE x.name = p_queue
                       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id INTO r.id FROM ins;
        ELSE
            -- The same (keep them in step), the key's send_key row first: the message's id
            -- comes from the sequence first (in q, which both inserts read), so that the key
            -- row can hold it; a key the queue has recorded (or that a running call holds: the
            -- insert waits for it) inserts nothing.
                WITH q AS (
                    SELECT x.id, x.priority_step_ms, nextval('tree_x.message_id_seq') AS mid
                      FROM tree_x.queue x
                     WHERE x.name = p_queue
                       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                ), k AS (
                    INSERT INTO tree_x.send_key AS k (queue_id, key, at_ms, ids)
                    SELECT q.id, p_send_key, v_now, ARRAY[q.mid] FROM q
                    ON CONFLICT (queue_id, key) DO NOTHING
                    RETURNING k.queue_id
                ), ins AS (
                    INSERT INTO tree_x.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT q.id, q.mid, v_gen,
                           tree_x._dequeue_at(v_at, p_priority, q.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM q JOIN k ON k.queue_id = q.id
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id INTO r.id FROM ins;
        END IF;
        IF FOUND THEN
            r.outcome := 'created';
            RETURN r.id;
        END IF;
    END IF;
    SELECT s.id, s.outcome INTO r.id, r.outcome
      FROM tree_x.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],
                               ARRAY[p_headers], ARRAY[p_at_ms], ARRAY[p_delay_ms], ARRAY[p_priority],
                               ARRAY[p_key], ARRAY[p_channel], p_on_conflict, p_now, p_send_key) s;
    RETURN r.id;
END $$;


ALTER FUNCTION tree_x.send_v3 SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
