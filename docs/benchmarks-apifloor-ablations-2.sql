CREATE SCHEMA "lonnymq_floor";
CREATE FUNCTION "lonnymq_floor".send(p_queue text, p_payload bytea, p_content_type text DEFAULT NULL) RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_id bigint;
BEGIN
  WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms), ins AS (INSERT INTO "tree_x".message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at, priority, content_type, payload) SELECT x.id, nextval('"tree_x".message_id_seq'), pg_sequence_last_value('"tree_x".message_gen_seq'), now.ms, now.ms, now.ms, 0, p_content_type, p_payload FROM "tree_x".queue x, now WHERE x.name = p_queue RETURNING m.queue_id, m.id, m.enqueued_at), st AS (INSERT INTO "tree_x".queue_stat (queue_id, minute, sent) SELECT ins.queue_id, ins.enqueued_at / 60000, 1 FROM ins) SELECT ins.id INTO STRICT v_id FROM ins;
  RETURN v_id;
END $fn$;
CREATE FUNCTION "lonnymq_floor".send_rows(p_queue text, p_payload bytea, p_content_type text DEFAULT NULL) RETURNS TABLE (id bigint, outcome text) LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RETURN QUERY WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms), ins AS (INSERT INTO "tree_x".message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at, priority, content_type, payload) SELECT x.id, nextval('"tree_x".message_id_seq'), pg_sequence_last_value('"tree_x".message_gen_seq'), now.ms, now.ms, now.ms, 0, p_content_type, p_payload FROM "tree_x".queue x, now WHERE x.name = p_queue RETURNING m.queue_id, m.id, m.enqueued_at), st AS (INSERT INTO "tree_x".queue_stat (queue_id, minute, sent) SELECT ins.queue_id, ins.enqueued_at / 60000, 1 FROM ins) SELECT ins.id, 'created'::text FROM ins;
  IF NOT FOUND THEN RAISE EXCEPTION 'no queue %', p_queue; END IF;
END $fn$;
CREATE FUNCTION "lonnymq_floor".pop(p_queue text) RETURNS SETOF "tree_x".delivery LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v record;
BEGIN
  SELECT x.id, x.max_attempts, pg_sequence_last_value('"tree_x".message_gen_seq') AS gen, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now INTO STRICT v FROM "tree_x".queue x WHERE x.name = p_queue;
  RETURN QUERY DELETE FROM "tree_x".message_logged m WHERE m.ctid = (SELECT x.ctid FROM "tree_x".message_logged x WHERE x.gen = v.gen AND x.queue_id = v.id AND x.channel IS NULL AND x.dequeue_at <= v.now ORDER BY x.dequeue_at, x.id LIMIT 1 FOR UPDATE SKIP LOCKED) AND m.attempts < v.max_attempts AND m.superseded_by IS NULL RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at, m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload;
END $fn$;
CREATE FUNCTION "lonnymq_floor".pop2(p_queue text) RETURNS SETOF "tree_x".delivery LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v record;
BEGIN
  SELECT x.id, x.max_attempts, pg_sequence_last_value('"tree_x".message_gen_seq') AS gen, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now INTO STRICT v FROM "tree_x".queue x WHERE x.name = p_queue;
  RETURN QUERY DELETE FROM "tree_x".message_logged m WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END FROM (VALUES (v.gen - 1), (v.gen)) AS g(gen) CROSS JOIN LATERAL ( SELECT x.ctid AS tid, x.id, x.dequeue_at, x.attempts < v.max_attempts AND x.superseded_by IS NULL AS ok FROM "tree_x".message_logged x WHERE x.gen = g.gen AND x.queue_id = v.id AND x.channel IS NULL AND x.dequeue_at <= v.now ORDER BY x.dequeue_at, x.id LIMIT 1 FOR UPDATE SKIP LOCKED) w ORDER BY w.dequeue_at, w.id LIMIT 1) RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at, m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload;
END $fn$;
CREATE FUNCTION lonnymq_floor.pop_one(p_queue text) RETURNS SETOF "tree_x".delivery LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RETURN QUERY DELETE FROM "tree_x".message_logged m USING (SELECT q.id, q.max_attempts, pg_sequence_last_value('"tree_x".message_gen_seq') AS gen, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now FROM "tree_x".queue q WHERE q.name = p_queue) h WHERE m.ctid = (SELECT x.ctid FROM "tree_x".message_logged x WHERE x.gen = h.gen AND x.queue_id = h.id AND x.channel IS NULL AND x.dequeue_at <= h.now ORDER BY x.dequeue_at, x.id LIMIT 1 FOR UPDATE SKIP LOCKED) AND m.attempts < h.max_attempts AND m.superseded_by IS NULL RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at, m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload;
END $fn$;
CREATE FUNCTION lonnymq_floor.pop2_one(p_queue text) RETURNS SETOF "tree_x".delivery LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RETURN QUERY DELETE FROM "tree_x".message_logged m USING (SELECT q.id, q.max_attempts, pg_sequence_last_value('"tree_x".message_gen_seq') AS gen, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now FROM "tree_x".queue q WHERE q.name = p_queue) h WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END FROM (VALUES (h.gen - 1), (h.gen)) AS g(gen) CROSS JOIN LATERAL ( SELECT x.ctid AS tid, x.id, x.dequeue_at, x.attempts < h.max_attempts AND x.superseded_by IS NULL AS ok FROM "tree_x".message_logged x WHERE x.gen = g.gen AND x.queue_id = h.id AND x.channel IS NULL AND x.dequeue_at <= h.now ORDER BY x.dequeue_at, x.id LIMIT 1 FOR UPDATE SKIP LOCKED) w ORDER BY w.dequeue_at, w.id LIMIT 1) RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at, m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload;
END $fn$;
CREATE FUNCTION lonnymq_floor.send_frame(p_queue text, p_payload bytea, p_content_type text DEFAULT NULL) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE v_id bigint;
BEGIN
  WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms), ins AS ( INSERT INTO "tree_x".message (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at, priority, content_type, payload) SELECT 1, nextval('"tree_x".message_id_seq'), 1, now.ms, now.ms, now.ms, 0, p_content_type, p_payload FROM now RETURNING id, enqueued_at), st AS (INSERT INTO "tree_x".queue_stat (queue_id, minute, sent) SELECT 1, ins.enqueued_at / 60000, 1 FROM ins) SELECT ins.id INTO STRICT v_id FROM ins;
  RETURN v_id;
END $fn$;
CREATE FUNCTION lonnymq_floor.pop_frame(p_queue text) RETURNS SETOF "tree_x".delivery LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  RETURN QUERY DELETE FROM "tree_x".message_logged m WHERE m.ctid = (SELECT x.ctid FROM "tree_x".message_logged x WHERE x.gen = 1 AND x.queue_id = 1 AND x.channel IS NULL AND x.dequeue_at <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint ORDER BY x.dequeue_at, x.id LIMIT 1 FOR UPDATE SKIP LOCKED) AND m.attempts < 5 AND m.superseded_by IS NULL RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at, m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload;
END $fn$;
