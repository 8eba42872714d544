-- Set-up of docs/benchmarks.md, "take()'s head, counted" (branch takehead): variants of take()'s
-- head statement as functions of their own (h0: the head as main has it; h1-h12: one piece
-- changed each, see the comments), and plain functions with one IF each (f0-f6), for
-- benchmarks/statement_instructions.py --setup (schema tree_x).
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
-- h1: the head with take's lean test and the frozen list by LEFT JOIN (the first variant)
CREATE FUNCTION tree_x.h1(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts, coalesce(p_lease_ms, x.lease_ms) AS lease,
           pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           f.gens AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND cardinality(p_ack_ids) = 1 AND cardinality(p_ack_tokens) = 1 AND x.id >= 0
               AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused AND NOT x.uses_channels
               AND NOT x.archive AND (p_lease_ms IS NULL OR p_lease_ms > 0) AS lean
      INTO v_head
      FROM tree_x.queue x
      LEFT JOIN tree_x.message_gen_frozen f ON f.queue_id = x.id
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
-- h2: h0 + the extra columns, frozen via subselect
CREATE FUNCTION tree_x.h2(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts, coalesce(p_lease_ms, x.lease_ms) AS lease,
           pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND cardinality(p_ack_ids) = 1 AND cardinality(p_ack_tokens) = 1 AND x.id >= 0
               AND NOT x.paused AND NOT x.uses_channels
               AND NOT x.archive AND (p_lease_ms IS NULL OR p_lease_ms > 0) AS lean
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
-- h3: h0 without the frozen lookup at all
CREATE FUNCTION tree_x.h3(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
-- h4: no SET clauses, h0 body
CREATE FUNCTION tree_x.h4(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
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
-- h5: empty function with SET clauses
CREATE FUNCTION tree_x.h5(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
BEGIN
    RETURN 1;
END $$;
-- h6: empty function without SET clauses
CREATE FUNCTION tree_x.h6(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN 1;
END $$;
-- h7: h0 without the whole row (x AS q), with the queue's id, max_attempts and lease instead
CREATE FUNCTION tree_x.h7(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x.id AS qid, x.max_attempts AS max_attempts, coalesce(p_lease_ms, x.lease_ms) AS lease, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
-- h8: h0 with a lean column (the lean test in SQL)
CREATE FUNCTION tree_x.h8(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND cardinality(p_ack_ids) = 1 AND cardinality(p_ack_tokens) = 1 AND x.id >= 0
               AND NOT x.paused AND NOT x.uses_channels
               AND NOT x.archive AND (p_lease_ms IS NULL OR p_lease_ms > 0) AS lean
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
-- h9: h0 with the queue's id, max_attempts and lease as columns of their own
CREATE FUNCTION tree_x.h9(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts, coalesce(p_lease_ms, x.lease_ms) AS lease, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
-- h10: h0 with started removed
CREATE FUNCTION tree_x.h10(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_head.gen;
END $$;
-- h11: h0 into scalar variables (the queue's id for its row: PostgreSQL 15 takes no row variable in a list)
CREATE FUNCTION tree_x.h11(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_id integer; v_gen bigint; v_started bigint; v_frozen bigint[]; v_now bigint;
BEGIN
    SELECT x.id, pg_sequence_last_value('tree_x.message_gen_seq'),
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0),
           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id),
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END
      INTO v_id, v_gen, v_started, v_frozen, v_now
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    RETURN v_gen;
END $$;
-- h12: h0 + the 5 assignments of take
CREATE FUNCTION tree_x.h12(p_queue text, p_limit integer, p_lease_ms bigint, p_ack_ids bigint[], p_ack_tokens integer[], p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE v_head record; q tree_x.queue; v_gen bigint; v_started bigint; v_frozen bigint[]; v_now bigint;
BEGIN
    SELECT x AS q, pg_sequence_last_value('tree_x.message_gen_seq') AS gen,
           coalesce(pg_sequence_last_value('tree_x.message_gen_started_seq'), 0) AS started,
           (SELECT f.gens FROM tree_x.message_gen_frozen f WHERE f.queue_id = x.id) AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                ELSE tree_x._now(p_now) END AS now
      INTO v_head
      FROM tree_x.queue x
     WHERE x.name = p_queue;
    IF NOT FOUND THEN RETURN 0; END IF;
    q := v_head.q;
    v_now := v_head.now;
    v_gen := v_head.gen;
    v_started := v_head.started;
    v_frozen := v_head.frozen;
    RETURN v_gen;
END $$;
-- f0-f6: an empty function; one IF of one function call (f1), of a NullTest (f2), of five
-- function calls (f3); five IFs of one call each (f4); one IF of two subscripts (f5); two
-- declarations, one with an initial value (f6)
CREATE FUNCTION tree_x.f0(p_limit integer, p_ids bigint[], p_toks integer[], p_lease bigint) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN 1;
END $$;
-- one IF with 1 function
CREATE FUNCTION tree_x.f1(p_limit integer, p_ids bigint[], p_toks integer[], p_lease bigint) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_limit = 1 THEN RETURN 1; END IF;
    RETURN 0;
END $$;
-- one IF with a NullTest only
CREATE FUNCTION tree_x.f2(p_limit integer, p_ids bigint[], p_toks integer[], p_lease bigint) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_ids IS NOT NULL THEN RETURN 1; END IF;
    RETURN 0;
END $$;
-- one IF with 5 functions
CREATE FUNCTION tree_x.f3(p_limit integer, p_ids bigint[], p_toks integer[], p_lease bigint) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_limit = 1 AND cardinality(p_ids) = 1 AND cardinality(p_toks) = 1 THEN RETURN 1; END IF;
    RETURN 0;
END $$;
-- five IFs with one function each
CREATE FUNCTION tree_x.f4(p_limit integer, p_ids bigint[], p_toks integer[], p_lease bigint) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_limit = 2 THEN RETURN 0; END IF;
    IF p_limit = 3 THEN RETURN 0; END IF;
    IF p_limit = 4 THEN RETURN 0; END IF;
    IF p_limit = 5 THEN RETURN 0; END IF;
    IF p_limit = 1 THEN RETURN 1; END IF;
    RETURN 0;
END $$;
-- an IF with subscripts
CREATE FUNCTION tree_x.f5(p_limit integer, p_ids bigint[], p_toks integer[], p_lease bigint) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_ids[1] IS NOT NULL AND p_toks[1] IS NOT NULL THEN RETURN 1; END IF;
    RETURN 0;
END $$;
-- assignment of a record field
CREATE FUNCTION tree_x.f6(p_limit integer, p_ids bigint[], p_toks integer[], p_lease bigint) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE v integer; w integer := p_limit;
BEGIN
    RETURN 1;
END $$;
