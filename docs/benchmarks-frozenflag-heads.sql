-- frozenflag: take()'s head (h0: main's) with the frozen flag and the sub-select in a CASE (k1), without any
-- frozen lookup (k2), the flag read alone (k3), the flag and _gen_frozen_of() in a CASE (k4, kept)
CREATE FUNCTION tree_x.h0(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
CREATE FUNCTION tree_x.k1(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           CASE WHEN pg_sequence_last_value('tree_x.message_gen_frozen_seq') = 0 THEN NULL
                ELSE (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) END AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
CREATE FUNCTION tree_x.k2(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           NULL::bigint[] AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
CREATE FUNCTION tree_x.k3(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           pg_sequence_last_value('tree_x.message_gen_frozen_seq') AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
-- k4: the flag, the list by a function call when it is set (kept)
CREATE FUNCTION tree_x.k4(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           CASE WHEN pg_sequence_last_value('tree_x.message_gen_frozen_seq') = 0 THEN NULL
                ELSE tree_x._gen_frozen_of(x.id) END AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
