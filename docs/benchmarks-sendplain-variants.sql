CREATE OR REPLACE FUNCTION tree_x.send_plain_v1(
    p_queue        text,
    p_payload      bytea,
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
    WITH ins AS (
        INSERT INTO tree_x.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                          kind, content_type, payload)
        SELECT x.id, v_gen, v_now, v_now, v_now, p_kind, p_content_type, p_payload
          FROM tree_x.queue x
         WHERE x.name = p_queue
           AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
        RETURNING m.id, m.queue_id
    ), st AS (
        INSERT INTO tree_x.queue_stat (queue_id, minute, sent)
        SELECT ins.queue_id, v_now / 60000, 1 FROM ins
    )
    SELECT ins.id INTO v_id FROM ins;
    IF NOT FOUND THEN
        SELECT s.id INTO v_id
          FROM tree_x.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type]) s;
    END IF;
    RETURN v_id;
END $$;
CREATE OR REPLACE FUNCTION tree_x.send_plain_v2(
    p_queue        text,
    p_payload      bytea,
    p_content_type text DEFAULT NULL,
    p_kind         text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    v_gen bigint := pg_sequence_last_value('tree_x.message_gen_seq');  -- _gen_write()'s first read
    v_id  bigint;
    v_q   integer;
BEGIN
    INSERT INTO tree_x.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                      kind, content_type, payload)
    SELECT x.id, v_gen, v_now, v_now, v_now, p_kind, p_content_type, p_payload
      FROM tree_x.queue x
     WHERE x.name = p_queue
       AND tree_x._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
    RETURNING m.id, m.queue_id INTO v_id, v_q;
    IF FOUND THEN
        INSERT INTO tree_x.queue_stat (queue_id, minute, sent) VALUES (v_q, v_now / 60000, 1);
    ELSE
        SELECT s.id INTO v_id
          FROM tree_x.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type]) s;
    END IF;
    RETURN v_id;
END $$;
