CREATE OR REPLACE FUNCTION tree_x.tt_ctl(
    p_queue   text,
    p_limit   integer DEFAULT 1,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF tree_x.delivery
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
DECLARE
    q          tree_x.queue;
    v_now      bigint;
    v_archive  boolean;
    v_want     integer;
    v_round    integer;
    v_ids      bigint[];
    v_dead     bigint[];
    v_gen      bigint;
    v_frozen   bigint[];
    v_old      bigint;
    v_more     integer;
    v_got      integer;
    -- Rows locked in frozen generations; NULL until then (each initial value is an expression
    -- that every call evaluates: 2 % of a pop's instructions).
    v_held     bigint[];
    v_held_tid tid[];
    v_held_ats bigint[];
    v_held_ok  boolean[];
    v_head     record;
BEGIN
    -- The queue, the clock, the generation counter and the queue's frozen generations, in one
    -- statement, as in take(), and whether the call may take the lean pop below (lean). The
    -- checks of _queue, _check_limit and _now are called only when they are going to fail.
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts,
           pg_sequence_last_value('tree_x.message_gen_seq') AS gen, f.gens AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND x.id >= 0 AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive) AS lean
      INTO v_head
      FROM tree_x.queue x
      LEFT JOIN tree_x.message_gen_frozen f ON f.queue_id = x.id
     WHERE x.name = p_queue;
    IF v_head.lean THEN
        -- One message of an ordinary queue (not paused, no channels, no archiving) and no
        -- frozen generation: the common pop. Every PL/pgSQL statement and expression costs its
        -- own checks (2-3k instructions each: the checks and assignments below, evaluated
        -- first, were 5 % of a pop; benchmarks/server_instructions.py), so nothing else runs
        -- before it. The general path's statement without its array and union: the first of
        -- the window's two candidates is deleted by ctid if it may be delivered (CASE: no
        -- subquery scan to filter it, 1.7 %); in message_logged, the partition of every
        -- ordinary queue (queues.sql), by name, as take(1)'s lease (keep the two in step).
        -- Nothing deleted (an empty queue, a candidate that may not be delivered, a row
        -- changed under the statement): on below (v_head.lean), which looks for what the
        -- general path must deal with.
        RETURN QUERY
        DELETE FROM tree_x.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                                   FROM (VALUES (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM tree_x.message_logged m
                                         WHERE m.gen = g.gen AND m.queue_id = v_head.qid AND m.channel IS NULL
                                           AND m.dequeue_at <= v_head.now
                                         ORDER BY m.dequeue_at, m.id
                                         LIMIT 1
                                           FOR UPDATE SKIP LOCKED) w
                                  ORDER BY w.dequeue_at, w.id
                                  LIMIT 1)
        RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                  m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                  m.last_error, m.payload;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF v_head.qid IS NULL THEN  -- no such queue
        q := tree_x._queue(p_queue);
    END IF;
    q := v_head.q;
    v_now := v_head.now;
    v_gen := v_head.gen;
    v_frozen := v_head.frozen;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM tree_x._check_limit(p_limit);
    END IF;
    v_archive := coalesce(p_archive, q.archive);
    v_want := p_limit;
    IF q.paused THEN  -- queue_pause: nothing is handed out
        RETURN;
    END IF;
    IF q.uses_channels THEN
        -- The channel row stays locked until the caller's transaction ends: the channel's
        -- messages taken here count against its max_concurrency while in flight.
        RETURN QUERY SELECT * FROM tree_x._take_channels(q, p_limit, NULL, v_now,
            CASE WHEN v_archive THEN 'archive' ELSE 'delete' END);
        RETURN;
    END IF;

    IF NOT v_archive THEN
        IF v_head.lean THEN
            v_got := 0;  -- the lean pop above delivered nothing
        ELSIF p_limit = 1 AND coalesce(cardinality(v_frozen), 0) = 0 THEN
            -- The same of an UNLOGGED queue, over the partitioned table (by ctid: the TIDs of
            -- the queue's partition, see settle.sql).
            RETURN QUERY
            DELETE FROM tree_x.message m
             WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                               FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                              CROSS JOIN LATERAL (
                                    SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                           m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                      FROM tree_x.message m
                                     WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                       AND m.dequeue_at <= v_now
                                     ORDER BY m.dequeue_at, m.id
                                     LIMIT p_limit
                                       FOR UPDATE SKIP LOCKED) w
                              ORDER BY w.dequeue_at, w.id
                              LIMIT 1)
               AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
            RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        ELSE
            FOREACH v_old IN ARRAY coalesce(v_frozen, ARRAY[]::bigint[]) LOOP
                v_more := p_limit - coalesce(cardinality(v_held), 0);
                EXIT WHEN v_more <= 0;
                SELECT v_held_tid || array_agg(x.tid), v_held || array_agg(x.id),
                       v_held_ats || array_agg(x.dequeue_at), v_held_ok || array_agg(x.ok)
                  INTO v_held_tid, v_held, v_held_ats, v_held_ok
                  FROM (SELECT m.ctid AS tid, m.id, m.dequeue_at,
                               m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                          FROM tree_x.message m
                         WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                           AND m.dequeue_at <= v_now
                         ORDER BY m.dequeue_at, m.id
                         LIMIT v_more
                           FOR UPDATE SKIP LOCKED) x;
            END LOOP;
            RETURN QUERY
            WITH d AS (
                DELETE FROM tree_x.message m
                 WHERE m.ctid = ANY (ARRAY(
                       SELECT c.tid
                         FROM (SELECT x.tid, x.ok
                                 FROM ((SELECT w.*
                                          FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                         CROSS JOIN LATERAL (
                                               SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                                      m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                 FROM tree_x.message m
                                                WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                                  AND m.dequeue_at <= v_now
                                                ORDER BY m.dequeue_at, m.id
                                                LIMIT p_limit
                                                  FOR UPDATE SKIP LOCKED) w)
                                       UNION ALL
                                       (SELECT * FROM unnest(v_held_tid, v_held, v_held_ats, v_held_ok))) x
                                ORDER BY x.dequeue_at, x.id
                                LIMIT p_limit) c
                        WHERE c.ok))
                   AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
                RETURNING m.*
            )
            SELECT d.id, d.attempts + 1, d.deliveries + 1, NULL::bigint, d.scheduled_at, d.enqueued_at,
                   d.priority, d.key, d.channel, d.kind, d.content_type, d.headers, d.state,
                   d.last_error, d.payload
              FROM d ORDER BY d.dequeue_at, d.id;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        END IF;
        v_want := p_limit - v_got;
        IF v_want <= 0 THEN  -- (a test of its own: a condition with a subquery is a statement)
            RETURN;
        END IF;
        -- Fewer than asked: done, unless an expired lease that may not be delivered is among
        -- the ready rows (the partial index of leases: usually none).
        IF NOT tree_x._undeliverable_ready(q, v_now) THEN
            RETURN;
        END IF;
    END IF;

    -- The general path: archiving, and the rows the lean path may not deliver. Deleted rows
    -- cannot be selected again.
    v_round := 0;
    LOOP
        SELECT r.ids, r.dead INTO v_ids, v_dead FROM tree_x._lock_ready(q, v_want, v_now) r;
        IF v_ids IS NOT NULL THEN
            RETURN QUERY SELECT * FROM tree_x._deliver(q, v_ids,
                CASE WHEN v_archive THEN 'archive' ELSE 'delete' END, NULL, v_now);
        END IF;
        v_want := v_want - coalesce(cardinality(v_ids), 0);
        v_round := v_round + 1;
        EXIT WHEN v_dead IS NULL OR v_want <= 0 OR v_round >= 10;
    END LOOP;
END $$;
ALTER FUNCTION tree_x.tt_ctl(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION tree_x.tt_onegen(
    p_queue   text,
    p_limit   integer DEFAULT 1,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF tree_x.delivery
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
DECLARE
    q          tree_x.queue;
    v_now      bigint;
    v_archive  boolean;
    v_want     integer;
    v_round    integer;
    v_ids      bigint[];
    v_dead     bigint[];
    v_gen      bigint;
    v_frozen   bigint[];
    v_old      bigint;
    v_more     integer;
    v_got      integer;
    -- Rows locked in frozen generations; NULL until then (each initial value is an expression
    -- that every call evaluates: 2 % of a pop's instructions).
    v_held     bigint[];
    v_held_tid tid[];
    v_held_ats bigint[];
    v_held_ok  boolean[];
    v_head     record;
BEGIN
    -- The queue, the clock, the generation counter and the queue's frozen generations, in one
    -- statement, as in take(), and whether the call may take the lean pop below (lean). The
    -- checks of _queue, _check_limit and _now are called only when they are going to fail.
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts,
           pg_sequence_last_value('tree_x.message_gen_seq') AS gen, f.gens AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND x.id >= 0 AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive) AS lean
      INTO v_head
      FROM tree_x.queue x
      LEFT JOIN tree_x.message_gen_frozen f ON f.queue_id = x.id
     WHERE x.name = p_queue;
    IF v_head.lean THEN
        -- One message of an ordinary queue (not paused, no channels, no archiving) and no
        -- frozen generation: the common pop. Every PL/pgSQL statement and expression costs its
        -- own checks (2-3k instructions each: the checks and assignments below, evaluated
        -- first, were 5 % of a pop; benchmarks/server_instructions.py), so nothing else runs
        -- before it. The general path's statement without its array and union: the first of
        -- the window's two candidates is deleted by ctid if it may be delivered (CASE: no
        -- subquery scan to filter it, 1.7 %); in message_logged, the partition of every
        -- ordinary queue (queues.sql), by name, as take(1)'s lease (keep the two in step).
        -- Nothing deleted (an empty queue, a candidate that may not be delivered, a row
        -- changed under the statement): on below (v_head.lean), which looks for what the
        -- general path must deal with.
        RETURN QUERY
        DELETE FROM tree_x.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                                   FROM (VALUES (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM tree_x.message_logged m
                                         WHERE m.gen = g.gen AND m.queue_id = v_head.qid AND m.channel IS NULL
                                           AND m.dequeue_at <= v_head.now
                                         ORDER BY m.dequeue_at, m.id
                                         LIMIT 1
                                           FOR UPDATE SKIP LOCKED) w
                                  ORDER BY w.dequeue_at, w.id
                                  LIMIT 1)
        RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                  m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                  m.last_error, m.payload;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF v_head.qid IS NULL THEN  -- no such queue
        q := tree_x._queue(p_queue);
    END IF;
    q := v_head.q;
    v_now := v_head.now;
    v_gen := v_head.gen;
    v_frozen := v_head.frozen;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM tree_x._check_limit(p_limit);
    END IF;
    v_archive := coalesce(p_archive, q.archive);
    v_want := p_limit;
    IF q.paused THEN  -- queue_pause: nothing is handed out
        RETURN;
    END IF;
    IF q.uses_channels THEN
        -- The channel row stays locked until the caller's transaction ends: the channel's
        -- messages taken here count against its max_concurrency while in flight.
        RETURN QUERY SELECT * FROM tree_x._take_channels(q, p_limit, NULL, v_now,
            CASE WHEN v_archive THEN 'archive' ELSE 'delete' END);
        RETURN;
    END IF;

    IF NOT v_archive THEN
        IF v_head.lean THEN
            v_got := 0;  -- the lean pop above delivered nothing
        ELSIF p_limit = 1 AND coalesce(cardinality(v_frozen), 0) = 0 THEN
            -- The same of an UNLOGGED queue, over the partitioned table (by ctid: the TIDs of
            -- the queue's partition, see settle.sql).
            RETURN QUERY
            DELETE FROM tree_x.message m
             WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                               FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                              CROSS JOIN LATERAL (
                                    SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                           m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                      FROM tree_x.message m
                                     WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                       AND m.dequeue_at <= v_now
                                     ORDER BY m.dequeue_at, m.id
                                     LIMIT p_limit
                                       FOR UPDATE SKIP LOCKED) w
                              ORDER BY w.dequeue_at, w.id
                              LIMIT 1)
               AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
            RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        ELSE
            FOREACH v_old IN ARRAY coalesce(v_frozen, ARRAY[]::bigint[]) LOOP
                v_more := p_limit - coalesce(cardinality(v_held), 0);
                EXIT WHEN v_more <= 0;
                SELECT v_held_tid || array_agg(x.tid), v_held || array_agg(x.id),
                       v_held_ats || array_agg(x.dequeue_at), v_held_ok || array_agg(x.ok)
                  INTO v_held_tid, v_held, v_held_ats, v_held_ok
                  FROM (SELECT m.ctid AS tid, m.id, m.dequeue_at,
                               m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                          FROM tree_x.message m
                         WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                           AND m.dequeue_at <= v_now
                         ORDER BY m.dequeue_at, m.id
                         LIMIT v_more
                           FOR UPDATE SKIP LOCKED) x;
            END LOOP;
            RETURN QUERY
            WITH d AS (
                DELETE FROM tree_x.message m
                 WHERE m.ctid = ANY (ARRAY(
                       SELECT c.tid
                         FROM (SELECT x.tid, x.ok
                                 FROM ((SELECT w.*
                                          FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                         CROSS JOIN LATERAL (
                                               SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                                      m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                 FROM tree_x.message m
                                                WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                                  AND m.dequeue_at <= v_now
                                                ORDER BY m.dequeue_at, m.id
                                                LIMIT p_limit
                                                  FOR UPDATE SKIP LOCKED) w)
                                       UNION ALL
                                       (SELECT * FROM unnest(v_held_tid, v_held, v_held_ats, v_held_ok))) x
                                ORDER BY x.dequeue_at, x.id
                                LIMIT p_limit) c
                        WHERE c.ok))
                   AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
                RETURNING m.*
            )
            SELECT d.id, d.attempts + 1, d.deliveries + 1, NULL::bigint, d.scheduled_at, d.enqueued_at,
                   d.priority, d.key, d.channel, d.kind, d.content_type, d.headers, d.state,
                   d.last_error, d.payload
              FROM d ORDER BY d.dequeue_at, d.id;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        END IF;
        v_want := p_limit - v_got;
        IF v_want <= 0 THEN  -- (a test of its own: a condition with a subquery is a statement)
            RETURN;
        END IF;
        -- Fewer than asked: done, unless an expired lease that may not be delivered is among
        -- the ready rows (the partial index of leases: usually none).
        IF NOT tree_x._undeliverable_ready(q, v_now) THEN
            RETURN;
        END IF;
    END IF;

    -- The general path: archiving, and the rows the lean path may not deliver. Deleted rows
    -- cannot be selected again.
    v_round := 0;
    LOOP
        SELECT r.ids, r.dead INTO v_ids, v_dead FROM tree_x._lock_ready(q, v_want, v_now) r;
        IF v_ids IS NOT NULL THEN
            RETURN QUERY SELECT * FROM tree_x._deliver(q, v_ids,
                CASE WHEN v_archive THEN 'archive' ELSE 'delete' END, NULL, v_now);
        END IF;
        v_want := v_want - coalesce(cardinality(v_ids), 0);
        v_round := v_round + 1;
        EXIT WHEN v_dead IS NULL OR v_want <= 0 OR v_round >= 10;
    END LOOP;
END $$;
ALTER FUNCTION tree_x.tt_onegen(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION tree_x.tt_nosortgen(
    p_queue   text,
    p_limit   integer DEFAULT 1,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF tree_x.delivery
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
DECLARE
    q          tree_x.queue;
    v_now      bigint;
    v_archive  boolean;
    v_want     integer;
    v_round    integer;
    v_ids      bigint[];
    v_dead     bigint[];
    v_gen      bigint;
    v_frozen   bigint[];
    v_old      bigint;
    v_more     integer;
    v_got      integer;
    -- Rows locked in frozen generations; NULL until then (each initial value is an expression
    -- that every call evaluates: 2 % of a pop's instructions).
    v_held     bigint[];
    v_held_tid tid[];
    v_held_ats bigint[];
    v_held_ok  boolean[];
    v_head     record;
BEGIN
    -- The queue, the clock, the generation counter and the queue's frozen generations, in one
    -- statement, as in take(), and whether the call may take the lean pop below (lean). The
    -- checks of _queue, _check_limit and _now are called only when they are going to fail.
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts,
           pg_sequence_last_value('tree_x.message_gen_seq') AS gen, f.gens AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND x.id >= 0 AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive) AS lean
      INTO v_head
      FROM tree_x.queue x
      LEFT JOIN tree_x.message_gen_frozen f ON f.queue_id = x.id
     WHERE x.name = p_queue;
    IF v_head.lean THEN
        -- One message of an ordinary queue (not paused, no channels, no archiving) and no
        -- frozen generation: the common pop. Every PL/pgSQL statement and expression costs its
        -- own checks (2-3k instructions each: the checks and assignments below, evaluated
        -- first, were 5 % of a pop; benchmarks/server_instructions.py), so nothing else runs
        -- before it. The general path's statement without its array and union: the first of
        -- the window's two candidates is deleted by ctid if it may be delivered (CASE: no
        -- subquery scan to filter it, 1.7 %); in message_logged, the partition of every
        -- ordinary queue (queues.sql), by name, as take(1)'s lease (keep the two in step).
        -- Nothing deleted (an empty queue, a candidate that may not be delivered, a row
        -- changed under the statement): on below (v_head.lean), which looks for what the
        -- general path must deal with.
        RETURN QUERY
        DELETE FROM tree_x.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                                   FROM (VALUES (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM tree_x.message_logged m
                                         WHERE m.gen = g.gen AND m.queue_id = v_head.qid AND m.channel IS NULL
                                           AND m.dequeue_at <= v_head.now
                                         ORDER BY m.dequeue_at, m.id
                                         LIMIT 1
                                           FOR UPDATE SKIP LOCKED) w
                                  )
        RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                  m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                  m.last_error, m.payload;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF v_head.qid IS NULL THEN  -- no such queue
        q := tree_x._queue(p_queue);
    END IF;
    q := v_head.q;
    v_now := v_head.now;
    v_gen := v_head.gen;
    v_frozen := v_head.frozen;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM tree_x._check_limit(p_limit);
    END IF;
    v_archive := coalesce(p_archive, q.archive);
    v_want := p_limit;
    IF q.paused THEN  -- queue_pause: nothing is handed out
        RETURN;
    END IF;
    IF q.uses_channels THEN
        -- The channel row stays locked until the caller's transaction ends: the channel's
        -- messages taken here count against its max_concurrency while in flight.
        RETURN QUERY SELECT * FROM tree_x._take_channels(q, p_limit, NULL, v_now,
            CASE WHEN v_archive THEN 'archive' ELSE 'delete' END);
        RETURN;
    END IF;

    IF NOT v_archive THEN
        IF v_head.lean THEN
            v_got := 0;  -- the lean pop above delivered nothing
        ELSIF p_limit = 1 AND coalesce(cardinality(v_frozen), 0) = 0 THEN
            -- The same of an UNLOGGED queue, over the partitioned table (by ctid: the TIDs of
            -- the queue's partition, see settle.sql).
            RETURN QUERY
            DELETE FROM tree_x.message m
             WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                               FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                              CROSS JOIN LATERAL (
                                    SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                           m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                      FROM tree_x.message m
                                     WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                       AND m.dequeue_at <= v_now
                                     ORDER BY m.dequeue_at, m.id
                                     LIMIT p_limit
                                       FOR UPDATE SKIP LOCKED) w
                              ORDER BY w.dequeue_at, w.id
                              LIMIT 1)
               AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
            RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        ELSE
            FOREACH v_old IN ARRAY coalesce(v_frozen, ARRAY[]::bigint[]) LOOP
                v_more := p_limit - coalesce(cardinality(v_held), 0);
                EXIT WHEN v_more <= 0;
                SELECT v_held_tid || array_agg(x.tid), v_held || array_agg(x.id),
                       v_held_ats || array_agg(x.dequeue_at), v_held_ok || array_agg(x.ok)
                  INTO v_held_tid, v_held, v_held_ats, v_held_ok
                  FROM (SELECT m.ctid AS tid, m.id, m.dequeue_at,
                               m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                          FROM tree_x.message m
                         WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                           AND m.dequeue_at <= v_now
                         ORDER BY m.dequeue_at, m.id
                         LIMIT v_more
                           FOR UPDATE SKIP LOCKED) x;
            END LOOP;
            RETURN QUERY
            WITH d AS (
                DELETE FROM tree_x.message m
                 WHERE m.ctid = ANY (ARRAY(
                       SELECT c.tid
                         FROM (SELECT x.tid, x.ok
                                 FROM ((SELECT w.*
                                          FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                         CROSS JOIN LATERAL (
                                               SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                                      m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                 FROM tree_x.message m
                                                WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                                  AND m.dequeue_at <= v_now
                                                ORDER BY m.dequeue_at, m.id
                                                LIMIT p_limit
                                                  FOR UPDATE SKIP LOCKED) w)
                                       UNION ALL
                                       (SELECT * FROM unnest(v_held_tid, v_held, v_held_ats, v_held_ok))) x
                                ORDER BY x.dequeue_at, x.id
                                LIMIT p_limit) c
                        WHERE c.ok))
                   AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
                RETURNING m.*
            )
            SELECT d.id, d.attempts + 1, d.deliveries + 1, NULL::bigint, d.scheduled_at, d.enqueued_at,
                   d.priority, d.key, d.channel, d.kind, d.content_type, d.headers, d.state,
                   d.last_error, d.payload
              FROM d ORDER BY d.dequeue_at, d.id;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        END IF;
        v_want := p_limit - v_got;
        IF v_want <= 0 THEN  -- (a test of its own: a condition with a subquery is a statement)
            RETURN;
        END IF;
        -- Fewer than asked: done, unless an expired lease that may not be delivered is among
        -- the ready rows (the partial index of leases: usually none).
        IF NOT tree_x._undeliverable_ready(q, v_now) THEN
            RETURN;
        END IF;
    END IF;

    -- The general path: archiving, and the rows the lean path may not deliver. Deleted rows
    -- cannot be selected again.
    v_round := 0;
    LOOP
        SELECT r.ids, r.dead INTO v_ids, v_dead FROM tree_x._lock_ready(q, v_want, v_now) r;
        IF v_ids IS NOT NULL THEN
            RETURN QUERY SELECT * FROM tree_x._deliver(q, v_ids,
                CASE WHEN v_archive THEN 'archive' ELSE 'delete' END, NULL, v_now);
        END IF;
        v_want := v_want - coalesce(cardinality(v_ids), 0);
        v_round := v_round + 1;
        EXIT WHEN v_dead IS NULL OR v_want <= 0 OR v_round >= 10;
    END LOOP;
END $$;
ALTER FUNCTION tree_x.tt_nosortgen(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION tree_x.tt_nofrozen(
    p_queue   text,
    p_limit   integer DEFAULT 1,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF tree_x.delivery
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
DECLARE
    q          tree_x.queue;
    v_now      bigint;
    v_archive  boolean;
    v_want     integer;
    v_round    integer;
    v_ids      bigint[];
    v_dead     bigint[];
    v_gen      bigint;
    v_frozen   bigint[];
    v_old      bigint;
    v_more     integer;
    v_got      integer;
    -- Rows locked in frozen generations; NULL until then (each initial value is an expression
    -- that every call evaluates: 2 % of a pop's instructions).
    v_held     bigint[];
    v_held_tid tid[];
    v_held_ats bigint[];
    v_held_ok  boolean[];
    v_head     record;
BEGIN
    -- The queue, the clock, the generation counter and the queue's frozen generations, in one
    -- statement, as in take(), and whether the call may take the lean pop below (lean). The
    -- checks of _queue, _check_limit and _now are called only when they are going to fail.
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts,
           pg_sequence_last_value('tree_x.message_gen_seq') AS gen, f.gens AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND x.id >= 0 AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive) AS lean
      INTO v_head
      FROM tree_x.queue x
      LEFT JOIN (SELECT NULL::int AS queue_id, NULL::bigint[] AS gens) f ON f.queue_id = x.id
     WHERE x.name = p_queue;
    IF v_head.lean THEN
        -- One message of an ordinary queue (not paused, no channels, no archiving) and no
        -- frozen generation: the common pop. Every PL/pgSQL statement and expression costs its
        -- own checks (2-3k instructions each: the checks and assignments below, evaluated
        -- first, were 5 % of a pop; benchmarks/server_instructions.py), so nothing else runs
        -- before it. The general path's statement without its array and union: the first of
        -- the window's two candidates is deleted by ctid if it may be delivered (CASE: no
        -- subquery scan to filter it, 1.7 %); in message_logged, the partition of every
        -- ordinary queue (queues.sql), by name, as take(1)'s lease (keep the two in step).
        -- Nothing deleted (an empty queue, a candidate that may not be delivered, a row
        -- changed under the statement): on below (v_head.lean), which looks for what the
        -- general path must deal with.
        RETURN QUERY
        DELETE FROM tree_x.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                                   FROM (VALUES (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM tree_x.message_logged m
                                         WHERE m.gen = g.gen AND m.queue_id = v_head.qid AND m.channel IS NULL
                                           AND m.dequeue_at <= v_head.now
                                         ORDER BY m.dequeue_at, m.id
                                         LIMIT 1
                                           FOR UPDATE SKIP LOCKED) w
                                  ORDER BY w.dequeue_at, w.id
                                  LIMIT 1)
        RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                  m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                  m.last_error, m.payload;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF v_head.qid IS NULL THEN  -- no such queue
        q := tree_x._queue(p_queue);
    END IF;
    q := v_head.q;
    v_now := v_head.now;
    v_gen := v_head.gen;
    v_frozen := v_head.frozen;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM tree_x._check_limit(p_limit);
    END IF;
    v_archive := coalesce(p_archive, q.archive);
    v_want := p_limit;
    IF q.paused THEN  -- queue_pause: nothing is handed out
        RETURN;
    END IF;
    IF q.uses_channels THEN
        -- The channel row stays locked until the caller's transaction ends: the channel's
        -- messages taken here count against its max_concurrency while in flight.
        RETURN QUERY SELECT * FROM tree_x._take_channels(q, p_limit, NULL, v_now,
            CASE WHEN v_archive THEN 'archive' ELSE 'delete' END);
        RETURN;
    END IF;

    IF NOT v_archive THEN
        IF v_head.lean THEN
            v_got := 0;  -- the lean pop above delivered nothing
        ELSIF p_limit = 1 AND coalesce(cardinality(v_frozen), 0) = 0 THEN
            -- The same of an UNLOGGED queue, over the partitioned table (by ctid: the TIDs of
            -- the queue's partition, see settle.sql).
            RETURN QUERY
            DELETE FROM tree_x.message m
             WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                               FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                              CROSS JOIN LATERAL (
                                    SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                           m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                      FROM tree_x.message m
                                     WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                       AND m.dequeue_at <= v_now
                                     ORDER BY m.dequeue_at, m.id
                                     LIMIT p_limit
                                       FOR UPDATE SKIP LOCKED) w
                              ORDER BY w.dequeue_at, w.id
                              LIMIT 1)
               AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
            RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        ELSE
            FOREACH v_old IN ARRAY coalesce(v_frozen, ARRAY[]::bigint[]) LOOP
                v_more := p_limit - coalesce(cardinality(v_held), 0);
                EXIT WHEN v_more <= 0;
                SELECT v_held_tid || array_agg(x.tid), v_held || array_agg(x.id),
                       v_held_ats || array_agg(x.dequeue_at), v_held_ok || array_agg(x.ok)
                  INTO v_held_tid, v_held, v_held_ats, v_held_ok
                  FROM (SELECT m.ctid AS tid, m.id, m.dequeue_at,
                               m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                          FROM tree_x.message m
                         WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                           AND m.dequeue_at <= v_now
                         ORDER BY m.dequeue_at, m.id
                         LIMIT v_more
                           FOR UPDATE SKIP LOCKED) x;
            END LOOP;
            RETURN QUERY
            WITH d AS (
                DELETE FROM tree_x.message m
                 WHERE m.ctid = ANY (ARRAY(
                       SELECT c.tid
                         FROM (SELECT x.tid, x.ok
                                 FROM ((SELECT w.*
                                          FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                         CROSS JOIN LATERAL (
                                               SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                                      m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                 FROM tree_x.message m
                                                WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                                  AND m.dequeue_at <= v_now
                                                ORDER BY m.dequeue_at, m.id
                                                LIMIT p_limit
                                                  FOR UPDATE SKIP LOCKED) w)
                                       UNION ALL
                                       (SELECT * FROM unnest(v_held_tid, v_held, v_held_ats, v_held_ok))) x
                                ORDER BY x.dequeue_at, x.id
                                LIMIT p_limit) c
                        WHERE c.ok))
                   AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
                RETURNING m.*
            )
            SELECT d.id, d.attempts + 1, d.deliveries + 1, NULL::bigint, d.scheduled_at, d.enqueued_at,
                   d.priority, d.key, d.channel, d.kind, d.content_type, d.headers, d.state,
                   d.last_error, d.payload
              FROM d ORDER BY d.dequeue_at, d.id;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        END IF;
        v_want := p_limit - v_got;
        IF v_want <= 0 THEN  -- (a test of its own: a condition with a subquery is a statement)
            RETURN;
        END IF;
        -- Fewer than asked: done, unless an expired lease that may not be delivered is among
        -- the ready rows (the partial index of leases: usually none).
        IF NOT tree_x._undeliverable_ready(q, v_now) THEN
            RETURN;
        END IF;
    END IF;

    -- The general path: archiving, and the rows the lean path may not deliver. Deleted rows
    -- cannot be selected again.
    v_round := 0;
    LOOP
        SELECT r.ids, r.dead INTO v_ids, v_dead FROM tree_x._lock_ready(q, v_want, v_now) r;
        IF v_ids IS NOT NULL THEN
            RETURN QUERY SELECT * FROM tree_x._deliver(q, v_ids,
                CASE WHEN v_archive THEN 'archive' ELSE 'delete' END, NULL, v_now);
        END IF;
        v_want := v_want - coalesce(cardinality(v_ids), 0);
        v_round := v_round + 1;
        EXIT WHEN v_dead IS NULL OR v_want <= 0 OR v_round >= 10;
    END LOOP;
END $$;
ALTER FUNCTION tree_x.tt_nofrozen(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION tree_x.tt_nowholerow(
    p_queue   text,
    p_limit   integer DEFAULT 1,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF tree_x.delivery
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
DECLARE
    q          tree_x.queue;
    v_now      bigint;
    v_archive  boolean;
    v_want     integer;
    v_round    integer;
    v_ids      bigint[];
    v_dead     bigint[];
    v_gen      bigint;
    v_frozen   bigint[];
    v_old      bigint;
    v_more     integer;
    v_got      integer;
    -- Rows locked in frozen generations; NULL until then (each initial value is an expression
    -- that every call evaluates: 2 % of a pop's instructions).
    v_held     bigint[];
    v_held_tid tid[];
    v_held_ats bigint[];
    v_held_ok  boolean[];
    v_head     record;
BEGIN
    -- The queue, the clock, the generation counter and the queue's frozen generations, in one
    -- statement, as in take(), and whether the call may take the lean pop below (lean). The
    -- checks of _queue, _check_limit and _now are called only when they are going to fail.
    SELECT NULL::tree_x.queue AS q, x.id AS qid, x.max_attempts AS max_attempts,
           pg_sequence_last_value('tree_x.message_gen_seq') AS gen, f.gens AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND x.id >= 0 AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive) AS lean
      INTO v_head
      FROM tree_x.queue x
      LEFT JOIN tree_x.message_gen_frozen f ON f.queue_id = x.id
     WHERE x.name = p_queue;
    IF v_head.lean THEN
        -- One message of an ordinary queue (not paused, no channels, no archiving) and no
        -- frozen generation: the common pop. Every PL/pgSQL statement and expression costs its
        -- own checks (2-3k instructions each: the checks and assignments below, evaluated
        -- first, were 5 % of a pop; benchmarks/server_instructions.py), so nothing else runs
        -- before it. The general path's statement without its array and union: the first of
        -- the window's two candidates is deleted by ctid if it may be delivered (CASE: no
        -- subquery scan to filter it, 1.7 %); in message_logged, the partition of every
        -- ordinary queue (queues.sql), by name, as take(1)'s lease (keep the two in step).
        -- Nothing deleted (an empty queue, a candidate that may not be delivered, a row
        -- changed under the statement): on below (v_head.lean), which looks for what the
        -- general path must deal with.
        RETURN QUERY
        DELETE FROM tree_x.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                                   FROM (VALUES (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM tree_x.message_logged m
                                         WHERE m.gen = g.gen AND m.queue_id = v_head.qid AND m.channel IS NULL
                                           AND m.dequeue_at <= v_head.now
                                         ORDER BY m.dequeue_at, m.id
                                         LIMIT 1
                                           FOR UPDATE SKIP LOCKED) w
                                  ORDER BY w.dequeue_at, w.id
                                  LIMIT 1)
        RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                  m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                  m.last_error, m.payload;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF v_head.qid IS NULL THEN  -- no such queue
        q := tree_x._queue(p_queue);
    END IF;
    q := v_head.q;
    v_now := v_head.now;
    v_gen := v_head.gen;
    v_frozen := v_head.frozen;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM tree_x._check_limit(p_limit);
    END IF;
    v_archive := coalesce(p_archive, q.archive);
    v_want := p_limit;
    IF q.paused THEN  -- queue_pause: nothing is handed out
        RETURN;
    END IF;
    IF q.uses_channels THEN
        -- The channel row stays locked until the caller's transaction ends: the channel's
        -- messages taken here count against its max_concurrency while in flight.
        RETURN QUERY SELECT * FROM tree_x._take_channels(q, p_limit, NULL, v_now,
            CASE WHEN v_archive THEN 'archive' ELSE 'delete' END);
        RETURN;
    END IF;

    IF NOT v_archive THEN
        IF v_head.lean THEN
            v_got := 0;  -- the lean pop above delivered nothing
        ELSIF p_limit = 1 AND coalesce(cardinality(v_frozen), 0) = 0 THEN
            -- The same of an UNLOGGED queue, over the partitioned table (by ctid: the TIDs of
            -- the queue's partition, see settle.sql).
            RETURN QUERY
            DELETE FROM tree_x.message m
             WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                               FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                              CROSS JOIN LATERAL (
                                    SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                           m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                      FROM tree_x.message m
                                     WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                       AND m.dequeue_at <= v_now
                                     ORDER BY m.dequeue_at, m.id
                                     LIMIT p_limit
                                       FOR UPDATE SKIP LOCKED) w
                              ORDER BY w.dequeue_at, w.id
                              LIMIT 1)
               AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
            RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        ELSE
            FOREACH v_old IN ARRAY coalesce(v_frozen, ARRAY[]::bigint[]) LOOP
                v_more := p_limit - coalesce(cardinality(v_held), 0);
                EXIT WHEN v_more <= 0;
                SELECT v_held_tid || array_agg(x.tid), v_held || array_agg(x.id),
                       v_held_ats || array_agg(x.dequeue_at), v_held_ok || array_agg(x.ok)
                  INTO v_held_tid, v_held, v_held_ats, v_held_ok
                  FROM (SELECT m.ctid AS tid, m.id, m.dequeue_at,
                               m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                          FROM tree_x.message m
                         WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                           AND m.dequeue_at <= v_now
                         ORDER BY m.dequeue_at, m.id
                         LIMIT v_more
                           FOR UPDATE SKIP LOCKED) x;
            END LOOP;
            RETURN QUERY
            WITH d AS (
                DELETE FROM tree_x.message m
                 WHERE m.ctid = ANY (ARRAY(
                       SELECT c.tid
                         FROM (SELECT x.tid, x.ok
                                 FROM ((SELECT w.*
                                          FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                         CROSS JOIN LATERAL (
                                               SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                                      m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                 FROM tree_x.message m
                                                WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                                  AND m.dequeue_at <= v_now
                                                ORDER BY m.dequeue_at, m.id
                                                LIMIT p_limit
                                                  FOR UPDATE SKIP LOCKED) w)
                                       UNION ALL
                                       (SELECT * FROM unnest(v_held_tid, v_held, v_held_ats, v_held_ok))) x
                                ORDER BY x.dequeue_at, x.id
                                LIMIT p_limit) c
                        WHERE c.ok))
                   AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
                RETURNING m.*
            )
            SELECT d.id, d.attempts + 1, d.deliveries + 1, NULL::bigint, d.scheduled_at, d.enqueued_at,
                   d.priority, d.key, d.channel, d.kind, d.content_type, d.headers, d.state,
                   d.last_error, d.payload
              FROM d ORDER BY d.dequeue_at, d.id;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        END IF;
        v_want := p_limit - v_got;
        IF v_want <= 0 THEN  -- (a test of its own: a condition with a subquery is a statement)
            RETURN;
        END IF;
        -- Fewer than asked: done, unless an expired lease that may not be delivered is among
        -- the ready rows (the partial index of leases: usually none).
        IF NOT tree_x._undeliverable_ready(q, v_now) THEN
            RETURN;
        END IF;
    END IF;

    -- The general path: archiving, and the rows the lean path may not deliver. Deleted rows
    -- cannot be selected again.
    v_round := 0;
    LOOP
        SELECT r.ids, r.dead INTO v_ids, v_dead FROM tree_x._lock_ready(q, v_want, v_now) r;
        IF v_ids IS NOT NULL THEN
            RETURN QUERY SELECT * FROM tree_x._deliver(q, v_ids,
                CASE WHEN v_archive THEN 'archive' ELSE 'delete' END, NULL, v_now);
        END IF;
        v_want := v_want - coalesce(cardinality(v_ids), 0);
        v_round := v_round + 1;
        EXIT WHEN v_dead IS NULL OR v_want <= 0 OR v_round >= 10;
    END LOOP;
END $$;
ALTER FUNCTION tree_x.tt_nowholerow(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION tree_x.tt_noset(
    p_queue   text,
    p_limit   integer DEFAULT 1,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF tree_x.delivery
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    q          tree_x.queue;
    v_now      bigint;
    v_archive  boolean;
    v_want     integer;
    v_round    integer;
    v_ids      bigint[];
    v_dead     bigint[];
    v_gen      bigint;
    v_frozen   bigint[];
    v_old      bigint;
    v_more     integer;
    v_got      integer;
    -- Rows locked in frozen generations; NULL until then (each initial value is an expression
    -- that every call evaluates: 2 % of a pop's instructions).
    v_held     bigint[];
    v_held_tid tid[];
    v_held_ats bigint[];
    v_held_ok  boolean[];
    v_head     record;
BEGIN
    -- The queue, the clock, the generation counter and the queue's frozen generations, in one
    -- statement, as in take(), and whether the call may take the lean pop below (lean). The
    -- checks of _queue, _check_limit and _now are called only when they are going to fail.
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts,
           pg_sequence_last_value('tree_x.message_gen_seq') AS gen, f.gens AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()
                ELSE tree_x._now(p_now) END AS now,
           p_limit = 1 AND x.id >= 0 AND coalesce(cardinality(f.gens), 0) = 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive) AS lean
      INTO v_head
      FROM tree_x.queue x
      LEFT JOIN tree_x.message_gen_frozen f ON f.queue_id = x.id
     WHERE x.name = p_queue;
    IF v_head.lean THEN
        -- One message of an ordinary queue (not paused, no channels, no archiving) and no
        -- frozen generation: the common pop. Every PL/pgSQL statement and expression costs its
        -- own checks (2-3k instructions each: the checks and assignments below, evaluated
        -- first, were 5 % of a pop; benchmarks/server_instructions.py), so nothing else runs
        -- before it. The general path's statement without its array and union: the first of
        -- the window's two candidates is deleted by ctid if it may be delivered (CASE: no
        -- subquery scan to filter it, 1.7 %); in message_logged, the partition of every
        -- ordinary queue (queues.sql), by name, as take(1)'s lease (keep the two in step).
        -- Nothing deleted (an empty queue, a candidate that may not be delivered, a row
        -- changed under the statement): on below (v_head.lean), which looks for what the
        -- general path must deal with.
        RETURN QUERY
        DELETE FROM tree_x.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                                   FROM (VALUES (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM tree_x.message_logged m
                                         WHERE m.gen = g.gen AND m.queue_id = v_head.qid AND m.channel IS NULL
                                           AND m.dequeue_at <= v_head.now
                                         ORDER BY m.dequeue_at, m.id
                                         LIMIT 1
                                           FOR UPDATE SKIP LOCKED) w
                                  ORDER BY w.dequeue_at, w.id
                                  LIMIT 1)
        RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                  m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                  m.last_error, m.payload;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF v_head.qid IS NULL THEN  -- no such queue
        q := tree_x._queue(p_queue);
    END IF;
    q := v_head.q;
    v_now := v_head.now;
    v_gen := v_head.gen;
    v_frozen := v_head.frozen;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM tree_x._check_limit(p_limit);
    END IF;
    v_archive := coalesce(p_archive, q.archive);
    v_want := p_limit;
    IF q.paused THEN  -- queue_pause: nothing is handed out
        RETURN;
    END IF;
    IF q.uses_channels THEN
        -- The channel row stays locked until the caller's transaction ends: the channel's
        -- messages taken here count against its max_concurrency while in flight.
        RETURN QUERY SELECT * FROM tree_x._take_channels(q, p_limit, NULL, v_now,
            CASE WHEN v_archive THEN 'archive' ELSE 'delete' END);
        RETURN;
    END IF;

    IF NOT v_archive THEN
        IF v_head.lean THEN
            v_got := 0;  -- the lean pop above delivered nothing
        ELSIF p_limit = 1 AND coalesce(cardinality(v_frozen), 0) = 0 THEN
            -- The same of an UNLOGGED queue, over the partitioned table (by ctid: the TIDs of
            -- the queue's partition, see settle.sql).
            RETURN QUERY
            DELETE FROM tree_x.message m
             WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                               FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                              CROSS JOIN LATERAL (
                                    SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                           m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                      FROM tree_x.message m
                                     WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                       AND m.dequeue_at <= v_now
                                     ORDER BY m.dequeue_at, m.id
                                     LIMIT p_limit
                                       FOR UPDATE SKIP LOCKED) w
                              ORDER BY w.dequeue_at, w.id
                              LIMIT 1)
               AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
            RETURNING m.id, m.attempts + 1, m.deliveries + 1, NULL::bigint, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        ELSE
            FOREACH v_old IN ARRAY coalesce(v_frozen, ARRAY[]::bigint[]) LOOP
                v_more := p_limit - coalesce(cardinality(v_held), 0);
                EXIT WHEN v_more <= 0;
                SELECT v_held_tid || array_agg(x.tid), v_held || array_agg(x.id),
                       v_held_ats || array_agg(x.dequeue_at), v_held_ok || array_agg(x.ok)
                  INTO v_held_tid, v_held, v_held_ats, v_held_ok
                  FROM (SELECT m.ctid AS tid, m.id, m.dequeue_at,
                               m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                          FROM tree_x.message m
                         WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                           AND m.dequeue_at <= v_now
                         ORDER BY m.dequeue_at, m.id
                         LIMIT v_more
                           FOR UPDATE SKIP LOCKED) x;
            END LOOP;
            RETURN QUERY
            WITH d AS (
                DELETE FROM tree_x.message m
                 WHERE m.ctid = ANY (ARRAY(
                       SELECT c.tid
                         FROM (SELECT x.tid, x.ok
                                 FROM ((SELECT w.*
                                          FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                         CROSS JOIN LATERAL (
                                               SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                                      m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                 FROM tree_x.message m
                                                WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                                  AND m.dequeue_at <= v_now
                                                ORDER BY m.dequeue_at, m.id
                                                LIMIT p_limit
                                                  FOR UPDATE SKIP LOCKED) w)
                                       UNION ALL
                                       (SELECT * FROM unnest(v_held_tid, v_held, v_held_ats, v_held_ok))) x
                                ORDER BY x.dequeue_at, x.id
                                LIMIT p_limit) c
                        WHERE c.ok))
                   AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
                RETURNING m.*
            )
            SELECT d.id, d.attempts + 1, d.deliveries + 1, NULL::bigint, d.scheduled_at, d.enqueued_at,
                   d.priority, d.key, d.channel, d.kind, d.content_type, d.headers, d.state,
                   d.last_error, d.payload
              FROM d ORDER BY d.dequeue_at, d.id;
            GET DIAGNOSTICS v_got = ROW_COUNT;
        END IF;
        v_want := p_limit - v_got;
        IF v_want <= 0 THEN  -- (a test of its own: a condition with a subquery is a statement)
            RETURN;
        END IF;
        -- Fewer than asked: done, unless an expired lease that may not be delivered is among
        -- the ready rows (the partial index of leases: usually none).
        IF NOT tree_x._undeliverable_ready(q, v_now) THEN
            RETURN;
        END IF;
    END IF;

    -- The general path: archiving, and the rows the lean path may not deliver. Deleted rows
    -- cannot be selected again.
    v_round := 0;
    LOOP
        SELECT r.ids, r.dead INTO v_ids, v_dead FROM tree_x._lock_ready(q, v_want, v_now) r;
        IF v_ids IS NOT NULL THEN
            RETURN QUERY SELECT * FROM tree_x._deliver(q, v_ids,
                CASE WHEN v_archive THEN 'archive' ELSE 'delete' END, NULL, v_now);
        END IF;
        v_want := v_want - coalesce(cardinality(v_ids), 0);
        v_round := v_round + 1;
        EXIT WHEN v_dead IS NULL OR v_want <= 0 OR v_round >= 10;
    END LOOP;
END $$;
ALTER FUNCTION tree_x.tt_noset(text, integer, boolean, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
