-- Variants of send_plain_once measured by benchmarks/statement_instructions.py against the
-- function itself (docs/benchmarks.md, "A lean keyed send"). Each is SECURITY DEFINER with the
-- pinned search_path, as security.sql makes every API function.

-- v1: the key's row first, from the queue's row (no CTE of the queue: the message reads the
-- queue's id and its own id from the key row's RETURNING).
CREATE OR REPLACE FUNCTION tree_x.send_plain_once_v1(
    p_queue        text,
    p_payload      bytea,
    p_send_key     uuid,
    p_content_type text DEFAULT NULL,
    p_kind         text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    v_gen bigint := pg_sequence_last_value('tree_x.message_gen_seq');  -- _gen_write()'s first read
    v_id  bigint;
BEGIN
    IF p_send_key IS NOT NULL THEN
        WITH k AS (
            INSERT INTO tree_x.send_key AS k (queue_id, key, at_ms, ids)
            SELECT x.id, p_send_key, v_now, ARRAY[nextval('tree_x.message_id_seq')]
              FROM tree_x.queue x
             WHERE x.name = p_queue
               AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
            ON CONFLICT (queue_id, key) DO NOTHING
            RETURNING k.queue_id, k.ids[1] AS mid
        ), ins AS (
            INSERT INTO tree_x.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at,
                                              kind, content_type, payload)
            SELECT k.queue_id, k.mid, v_gen, v_now, v_now, v_now, p_kind, p_content_type, p_payload
              FROM k
            RETURNING m.id, m.queue_id
        ), st AS (
            INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
            SELECT ins.queue_id, v_now / 60000, 1 FROM ins
        )
        SELECT ins.id INTO v_id FROM ins;
    END IF;
    IF NOT FOUND THEN
        SELECT s.id INTO v_id
          FROM tree_x.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],
                                 p_send_key => p_send_key) s
         ORDER BY s.ord
         LIMIT 1;
    END IF;
    RETURN v_id;
END $$;

-- v0: send_plain_once as it is, without the IF on the key (what the IF costs).
CREATE OR REPLACE FUNCTION tree_x.send_plain_once_v0(
    p_queue        text,
    p_payload      bytea,
    p_send_key     uuid,
    p_content_type text DEFAULT NULL,
    p_kind         text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    v_gen bigint := pg_sequence_last_value('tree_x.message_gen_seq');  -- _gen_write()'s first read
    v_id  bigint;
BEGIN
    WITH q AS (
        SELECT x.id, nextval('tree_x.message_id_seq') AS mid
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
                                          kind, content_type, payload)
        SELECT q.id, q.mid, v_gen, v_now, v_now, v_now, p_kind, p_content_type, p_payload
          FROM q JOIN k ON k.queue_id = q.id
        RETURNING m.id, m.queue_id
    ), st AS (
        INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
        SELECT ins.queue_id, v_now / 60000, 1 FROM ins
    )
    SELECT ins.id INTO v_id FROM ins;
    IF NOT FOUND THEN
        SELECT s.id INTO v_id
          FROM tree_x.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],
                                 p_send_key => p_send_key) s
         ORDER BY s.ord
         LIMIT 1;
    END IF;
    RETURN v_id;
END $$;
