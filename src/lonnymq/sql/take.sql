-- LonnyMQ take: leasing ready messages (take, take_tx), looking without leasing (peek) and
-- the wait until the next one is ready (next_ready_in), with the candidate queries they share
-- (_lock_ready, _deliver) and the round-robin path of channel queues (_take_channels).
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- The hot query of take() and take_tx() on a plain queue: lock up to p_limit ready messages in
-- (dequeue_at, id) order, skipping rows others hold. Messages whose lease expired on their last
-- allowed attempt are dead-lettered here, superseded versions whose lease expired (send_batch)
-- are deleted (both in dead, which callers use only to know that rows left); the rest are
-- returned in order (ids, with their dequeue_at in ats for the channel path's merge).
-- Locks rows of the queue's frozen generations first, oldest first, until p_limit are held (a
-- backlog: generations.sql), then reads the two generations of the window, each in index order,
-- and merges them with the frozen rows it holds; rows beyond p_limit may stay locked until the
-- transaction ends. While the rotation that moved the window is unsettled for its first
-- statement (generations.sql, "The rotor"), the generation it pushes out (G-2) is read as one
-- more frozen one, after the queue's: its backlog there is committed and unlocked, the rows it
-- moves are locked by it (skipped). Reads message_gen_seq, the rotor and the frozen flag
-- (sequences), message_gen_frozen, message.
CREATE OR REPLACE FUNCTION {schema}._lock_ready(q {schema}.queue, p_limit integer, p_now bigint,
                                     OUT ids bigint[], OUT ats bigint[], OUT dead bigint[])
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_gone   bigint[];
    v_gen    bigint;
    v_frozen bigint[];
    v_old    bigint;
    v_out    bigint;  -- G-2 while the rotation that moved the window is unsettled, else NULL
    v_held       bigint[]  := ARRAY[]::bigint[];  -- the frozen rows locked, and their columns
    v_held_ats   bigint[]  := ARRAY[]::bigint[];
    v_held_tries integer[] := ARRAY[]::integer[];
    v_held_live  boolean[] := ARRAY[]::boolean[];
    v_more       integer;
BEGIN
    -- The frozen generations only when the frozen flag says a queue may have one, as take()'s
    -- head reads them (generations.sql, "The frozen flag": read after this statement's snapshot),
    -- and the rotor after the generation (the scan of the sequence comes before the select
    -- list), in the same snapshot (generations.sql, "The rotor").
    -- (A STABLE function's call: its expressions run in this statement's snapshot, without
    -- one of their own. The rotor's values as columns here and the test in an IF of this
    -- function cost 8k instructions more: docs/benchmarks.md, "A false empty take while
    -- another transaction rotates".)
    SELECT s.last_value,
           CASE WHEN pg_sequence_last_value('{schema}.message_gen_frozen_seq') = 0 THEN NULL
                ELSE {schema}._gen_frozen_of(q.id) END,
           CASE WHEN {schema}._gen_rotor_unsettled() THEN s.last_value - 2 END
      INTO v_gen, v_frozen, v_out
      FROM {schema}.message_gen_seq s;
    -- Unsettled: G-2 after the queue's frozen generations (older than it), unless the list has
    -- it already (a row must not be locked and returned twice).
    IF v_out IS NOT NULL THEN
        IF NOT coalesce(v_out = ANY (v_frozen), false) THEN
            v_frozen := coalesce(v_frozen, ARRAY[]::bigint[]) || v_out;
        END IF;
    END IF;
    FOREACH v_old IN ARRAY coalesce(v_frozen, ARRAY[]::bigint[]) LOOP
        v_more := p_limit - coalesce(cardinality(v_held), 0);
        EXIT WHEN v_more <= 0;
        SELECT v_held || array_agg(x.id), v_held_ats || array_agg(x.dequeue_at),
               v_held_tries || array_agg(x.attempts), v_held_live || array_agg(x.live)
          INTO v_held, v_held_ats, v_held_tries, v_held_live
          FROM (SELECT m.id, m.dequeue_at, m.attempts, m.superseded_by IS NULL AS live
                  FROM {schema}.message m
                 WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                   AND m.dequeue_at <= p_now
                 ORDER BY m.dequeue_at, m.id
                 LIMIT v_more
                   FOR UPDATE SKIP LOCKED) x;
    END LOOP;
    SELECT array_agg(c.id ORDER BY c.dequeue_at, c.id) FILTER (WHERE c.live AND c.attempts < q.max_attempts),
           array_agg(c.dequeue_at ORDER BY c.dequeue_at, c.id) FILTER (WHERE c.live AND c.attempts < q.max_attempts),
           array_agg(c.id) FILTER (WHERE c.live AND c.attempts >= q.max_attempts),
           array_agg(c.id) FILTER (WHERE NOT c.live)
      INTO ids, ats, dead, v_gone
      FROM (SELECT x.id, x.dequeue_at, x.attempts, x.live
              FROM ((SELECT w.*
                       FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                      CROSS JOIN LATERAL (
                            SELECT m.id, m.dequeue_at, m.attempts, m.superseded_by IS NULL AS live
                              FROM {schema}.message m
                             WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                               AND m.dequeue_at <= p_now
                             ORDER BY m.dequeue_at, m.id
                             LIMIT p_limit
                               FOR UPDATE SKIP LOCKED) w)
                    UNION ALL
                    (SELECT * FROM unnest(v_held, v_held_ats, v_held_tries, v_held_live))) x
             ORDER BY x.dequeue_at, x.id
             LIMIT p_limit) c;
    IF dead IS NOT NULL THEN
        PERFORM {schema}._dead_letter(q, dead,
            array_fill('lease expired on the last attempt'::text, ARRAY[cardinality(dead)]), p_now);
    END IF;
    IF v_gone IS NOT NULL THEN
        PERFORM {schema}._drop_superseded(q, v_gone, p_now);
        dead := coalesce(dead, ARRAY[]::bigint[]) || v_gone;
    END IF;
END $$;

-- Whether queue q has a ready row that take()'s and take_tx()'s lean statements leave to the
-- general path: an expired lease that may not be delivered (its last attempt, or a superseded
-- version), read in the partial index of leases (usually empty), pinned by its order (its
-- callers' enable_sort = off: take, take_tx): a plan cached while the table was empty would
-- otherwise walk the whole dequeue index (queue_id is its second column) once the table fills
-- (test_pop_lean.py). PL/pgSQL, so that its plan is cached: it was a SQL function, which
-- PostgreSQL never inlines when its body has a sub-select, so fmgr_sql planned its statement at
-- every call (~700k instructions, 2/3 of an empty pop: docs/benchmarks.md, branch poplean).
CREATE OR REPLACE FUNCTION {schema}._undeliverable_ready(q {schema}.queue, p_now bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM FROM {schema}.message m
      WHERE m.queue_id = q.id AND m.channel IS NULL AND m.leased AND m.dequeue_at <= p_now
        AND (m.attempts >= q.max_attempts OR m.superseded_by IS NOT NULL)
      ORDER BY m.channel, m.dequeue_at  -- the lease index's order
      LIMIT 1;
    RETURN FOUND;
END $$;

-- Hand out locked messages p_ids, in that order: 'lease' them for p_lease_ms, or 'delete' /
-- 'archive' them (take_tx). Returns the deliveries in the order of p_ids. Each row is found by
-- its key (a LATERAL probe, OFFSET 0 so that it stays one) and changed by its ctid, which stays
-- put while this transaction holds the row: a join of the ids with the message table would be
-- planned from statistics, and statistics taken while a snapshot is held (ANALYZE then counts
-- only the live rows) make the planner read every entry the queue left in the primary key
-- (4,000 for a take(10) after 2,000 messages; tests/sql/test_plans.py). Why "IS TRUE": see
-- settle.sql's header.
CREATE OR REPLACE FUNCTION {schema}._deliver(q {schema}.queue, p_ids bigint[], p_mode text, p_lease_ms bigint,
                                  p_now bigint)
RETURNS SETOF {schema}.delivery
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_mode = 'lease' THEN
        RETURN QUERY
        WITH u AS (
            UPDATE {schema}.message m
               SET dequeue_at = p_now + p_lease_ms, attempts = m.attempts + 1,
                   deliveries = m.deliveries + 1, leased = true
              FROM (SELECT t.ord, k.tid
                      FROM unnest(p_ids) WITH ORDINALITY AS t(id, ord)
                     CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM {schema}.message x
                                          WHERE x.queue_id = q.id AND x.id = t.id OFFSET 0) k) t
             WHERE m.ctid = t.tid AND (m.queue_id = q.id) IS TRUE
            RETURNING t.ord, m.*
        )
        SELECT u.id, u.attempts, u.deliveries, u.dequeue_at, u.scheduled_at, u.enqueued_at,
               u.priority, u.key, u.channel, u.kind, u.content_type, u.headers, u.state,
               u.last_error, u.payload
          FROM u ORDER BY u.ord;
    ELSE
        RETURN QUERY
        WITH d AS (
            DELETE FROM {schema}.message m
             USING (SELECT t.ord, k.tid
                      FROM unnest(p_ids) WITH ORDINALITY AS t(id, ord)
                     CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM {schema}.message x
                                          WHERE x.queue_id = q.id AND x.id = t.id OFFSET 0) k) t
             WHERE m.ctid = t.tid AND (m.queue_id = q.id) IS TRUE
            RETURNING t.ord, m.*
        ), a AS (
            INSERT INTO {schema}.archive (queue_id, id, status, archived_at, scheduled_at,
                                          enqueued_at, attempts, deliveries, priority, key,
                                          channel, kind, content_type, headers, state,
                                          last_error, payload)
            SELECT d.queue_id, d.id, 'acked', p_now, d.scheduled_at, d.enqueued_at,
                   d.attempts + 1, d.deliveries + 1, d.priority, d.key, d.channel, d.kind,
                   d.content_type, d.headers, d.state, d.last_error, d.payload
              FROM d WHERE p_mode = 'archive'
        )
        SELECT d.id, d.attempts + 1, d.deliveries + 1, NULL::bigint, d.scheduled_at,
               d.enqueued_at, d.priority, d.key, d.channel, d.kind, d.content_type, d.headers,
               d.state, d.last_error, d.payload
          FROM d ORDER BY d.ord;
    END IF;
END $$;

-- take and take_tx of a queue that uses channels. A call serves the ready channels round robin
-- by (ready_at, turn), interleaved by time with plain messages, in passes: each pass picks up to
-- the number still wanted of the next ready channels (after a cursor), locks their heads, merges
-- them with the plain candidates by time, and delivers the earliest, with one statement per
-- step. A served channel's new key (ready_at >= now, a new turn) sorts after every channel still
-- waiting, so the next pass goes round again. Every step is an index lookup per row, whatever
-- the number of channels or messages; rows others hold are skipped, never waited for. A head
-- whose lease expired on its last attempt is dead-lettered (at most p_limit per call, besides
-- the p_limit deliveries). p_mode: 'lease' (take), 'delete' or 'archive' (take_tx).
CREATE OR REPLACE FUNCTION {schema}._take_channels(
    q          {schema}.queue,
    p_limit    integer,
    p_lease_ms bigint,
    p_now      bigint,
    p_mode     text
) RETURNS SETOF {schema}.delivery
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_plain    bigint[];
    v_plain_at bigint[];
    v_dead     bigint[];
    v_next     integer := 1;  -- the first plain candidate not delivered yet
    v_got      integer := 0;
    v_dead_n   integer := 0;
    v_want     integer;
    v_bound    bigint;
    -- The pick's keyset cursor over (ready_at, turn): the last channel served. It also keeps
    -- the pick from rereading the index entries this call's own updates left behind.
    v_at       bigint := -9223372036854775807;
    v_turn     bigint := 0::bigint;
    v_skip     text[] := ARRAY[]::text[];  -- channels with nothing deliverable now
    v_open     text[] := ARRAY[]::text[];  -- take_tx: channels of messages taken, in flight
    v_picked   integer;
    v_ready    record;
    v_h_names  text[];
    v_h_ids    bigint[];
    v_h_keys   bigint[];
    v_h_turns  bigint[];
    v_h_leased boolean[];
    v_h_dead   boolean[];
    v_h_gone   boolean[];  -- superseded versions whose lease expired: deleted
    v_gone     bigint[];
    v_ids      bigint[];
    v_from     text[];
    v_leased   boolean[];
    v_nohead   text[];
    v_n_plain  integer;
    v_served   integer;
    v_last_at  bigint;
    v_last_tn  bigint;
BEGIN
    -- The plain candidates, locked (and the dead among them dead-lettered) as in take(). An
    -- assignment, not SELECT ... FROM: plpgsql evaluates a lone function call as a simple
    -- expression, without a statement's executor start.
    v_ready := {schema}._lock_ready(q, p_limit, p_now);
    v_plain := v_ready.ids;
    v_plain_at := v_ready.ats;
    v_dead := v_ready.dead;
    IF v_dead IS NOT NULL THEN
        v_dead_n := cardinality(v_dead);
    END IF;
    v_plain := coalesce(v_plain, ARRAY[]::bigint[]);
    v_plain_at := coalesce(v_plain_at, ARRAY[]::bigint[]);

    LOOP
        v_want := p_limit - v_got;
        EXIT WHEN v_want <= 0;
        v_h_ids := NULL;
        v_nohead := ARRAY[]::text[];
        v_dead := ARRAY[]::bigint[];
        -- A channel after the v_want-th plain candidate cannot win a place in this pass.
        v_bound := least(p_now, v_plain_at[v_next + v_want - 1]);

        -- 1. The next ready channels, locked, and 2. their heads, locked, in one statement: at
        -- the concurrency limit only an expired lease may be delivered again. A channel without
        -- a deliverable head (another transaction holds it, or ready_at was early since a lease
        -- was extended) is passed by (v_nohead).
        SELECT count(*)::integer,
               array_agg(c.name ORDER BY c.ready_at, c.turn) FILTER (WHERE h.id IS NULL),
               array_agg(c.name ORDER BY c.ready_at, c.turn) FILTER (WHERE h.id IS NOT NULL),
               array_agg(h.id ORDER BY c.ready_at, c.turn) FILTER (WHERE h.id IS NOT NULL),
               array_agg(c.ready_at ORDER BY c.ready_at, c.turn) FILTER (WHERE h.id IS NOT NULL),
               array_agg(c.turn ORDER BY c.ready_at, c.turn) FILTER (WHERE h.id IS NOT NULL),
               array_agg(h.leased ORDER BY c.ready_at, c.turn) FILTER (WHERE h.id IS NOT NULL),
               array_agg(h.attempts >= q.max_attempts ORDER BY c.ready_at, c.turn) FILTER (WHERE h.id IS NOT NULL),
               array_agg(h.gone ORDER BY c.ready_at, c.turn) FILTER (WHERE h.id IS NOT NULL)
          INTO v_picked, v_nohead, v_h_names, v_h_ids, v_h_keys, v_h_turns, v_h_leased, v_h_dead,
               v_h_gone
          FROM (SELECT c.name, c.ready_at, c.turn,
                       coalesce(c.current_concurrency + cardinality(array_positions(v_open, c.name))
                                >= c.max_concurrency, false) AS limited
                  FROM {schema}.channel c
                 WHERE c.queue_id = q.id AND c.ready_at <= v_bound
                   AND (c.ready_at, c.turn) > (v_at, v_turn) AND c.name <> ALL (v_skip)
                 ORDER BY c.ready_at, c.turn
                 LIMIT v_want
                   FOR UPDATE SKIP LOCKED) c
          LEFT JOIN LATERAL (
                SELECT m.id, m.leased, m.attempts, m.superseded_by IS NOT NULL AS gone
                  FROM {schema}.message m
                 WHERE NOT c.limited AND m.queue_id = q.id AND m.channel = c.name
                   AND m.dequeue_at <= p_now
                 ORDER BY m.dequeue_at, m.id
                 LIMIT 1
                   FOR UPDATE SKIP LOCKED) a ON true
          LEFT JOIN LATERAL (
                SELECT m.id, m.leased, m.attempts, m.superseded_by IS NOT NULL AS gone
                  FROM {schema}.message m
                 WHERE c.limited AND m.queue_id = q.id AND m.channel = c.name
                   AND m.leased AND m.dequeue_at <= p_now
                 ORDER BY m.dequeue_at
                 LIMIT 1
                   FOR UPDATE SKIP LOCKED) b ON true
         CROSS JOIN LATERAL (SELECT coalesce(a.id, b.id) AS id, coalesce(a.leased, b.leased) AS leased,
                                    coalesce(a.attempts, b.attempts) AS attempts,
                                    coalesce(a.gone, b.gone) AS gone) h;
        EXIT WHEN v_picked = 0 AND v_next > cardinality(v_plain);
        v_nohead := coalesce(v_nohead, ARRAY[]::text[]);

        IF v_picked > 0 THEN
            IF cardinality(v_nohead) > 0 THEN
                UPDATE {schema}.channel c
                   SET ready_at = {schema}._channel_ready_at(
                           c.queue_id, c.name, c.current_size, c.current_concurrency,
                           c.max_concurrency, c.last_served_at, c.release_interval_ms,
                           c.blocked_until)
                 WHERE c.queue_id = q.id AND c.name = ANY (v_nohead);
                v_skip := v_skip || v_nohead;
            END IF;
            -- Heads whose lease expired on the last attempt go to the dead letters; their
            -- channels are served again in the next pass (or call).
            IF true = ANY (v_h_dead) AND v_dead_n < p_limit THEN
                v_dead := ARRAY(SELECT h.id FROM unnest(v_h_ids, v_h_dead, v_h_gone) AS h(id, dead, gone)
                                 WHERE h.dead AND NOT h.gone LIMIT p_limit - v_dead_n);
                PERFORM {schema}._dead_letter(q, v_dead,
                    array_fill('lease expired on the last attempt'::text, ARRAY[cardinality(v_dead)]),
                    p_now);
                v_dead_n := v_dead_n + cardinality(v_dead);
            END IF;
            -- Superseded versions whose lease expired leave (the new version is another
            -- message); their channels are served again like those of dead letters.
            IF true = ANY (v_h_gone) THEN
                v_gone := ARRAY(SELECT h.id FROM unnest(v_h_ids, v_h_gone) AS h(id, gone) WHERE h.gone);
                PERFORM {schema}._drop_superseded(q, v_gone, p_now);
                v_dead := v_dead || v_gone;
            END IF;
        END IF;

        -- 3. Merge by time with the plain candidates (a plain message first on a tie) and
        -- deliver the earliest v_want. With no plain candidate left and every head deliverable
        -- (a queue of channels only, the common case), the heads in pick order are the merge:
        -- the pick is ordered by (ready_at, turn), the merge's key, and takes at most v_want.
        IF v_next > cardinality(v_plain) AND v_h_ids IS NOT NULL
           AND NOT (true = ANY (v_h_dead) OR true = ANY (v_h_gone)) THEN
            v_ids := v_h_ids;
            v_from := v_h_names;
            v_leased := v_h_leased;
            v_n_plain := 0;
            v_served := cardinality(v_h_ids);
            v_last_at := v_h_keys[v_served];
            v_last_tn := v_h_turns[v_served];
        ELSE
            SELECT array_agg(x.id ORDER BY x.key, x.turn), array_agg(x.name ORDER BY x.key, x.turn),
                   array_agg(x.leased ORDER BY x.key, x.turn),
                   (count(*) FILTER (WHERE x.name IS NULL))::integer,
                   (count(*) FILTER (WHERE x.name IS NOT NULL))::integer,
                   (array_agg(x.key ORDER BY x.key DESC, x.turn DESC) FILTER (WHERE x.name IS NOT NULL))[1],
                   (array_agg(x.turn ORDER BY x.key DESC, x.turn DESC) FILTER (WHERE x.name IS NOT NULL))[1]
              INTO v_ids, v_from, v_leased, v_n_plain, v_served, v_last_at, v_last_tn
              FROM (SELECT y.* FROM (
                        SELECT p.id, p.key, -1::bigint AS turn, NULL::text AS name, false AS leased
                          FROM unnest(v_plain[v_next:], v_plain_at[v_next:]) AS p(id, key)
                        UNION ALL
                        SELECT h.id, h.key, h.turn, h.name, h.leased
                          FROM unnest(v_h_ids, v_h_keys, v_h_turns, v_h_names, v_h_leased, v_h_dead, v_h_gone)
                               AS h(id, key, turn, name, leased, dead, gone)
                         WHERE NOT h.dead AND NOT h.gone) y
                     ORDER BY y.key, y.turn
                     LIMIT v_want) x;
        END IF;
        IF v_ids IS NULL THEN
            -- No delivery: go on only if this pass changed something (a channel passed by or
            -- a dead letter) and there is something left to look at.
            EXIT WHEN cardinality(v_nohead) = 0 AND cardinality(v_dead) = 0;
            CONTINUE;
        END IF;

        RETURN QUERY SELECT * FROM {schema}._deliver(q, v_ids, p_mode, p_lease_ms, p_now);
        v_got := v_got + cardinality(v_ids);
        v_next := v_next + v_n_plain;

        -- 4. The served channels (one each, held since the pick): a lease more (none for an
        -- expired one retaken) or a message less (take_tx), last served now, a new turn in
        -- serving order, a fresh ready_at, by one UPDATE. Each row is reached by its full key
        -- (a LATERAL probe, OFFSET 0 so that it stays one) and changed by its ctid: a join with
        -- the channel table would be planned from its statistics, which may predate most of
        -- the queue's channels and then scan all of them (see _channel_apply_one in
        -- channels.sql). The turns are drawn in serving order, by the scan of the served
        -- names. ready_at is _channel_ready_at's, inline (a plpgsql call and its statement less
        -- a channel): the row has been held since the pick, so the snapshot of this statement,
        -- which starts after, has every change of the channel's messages, and the UPDATE
        -- never waits. No head: NULL (no row).
        IF v_served > 0 THEN
            UPDATE {schema}.channel c
               SET current_size = c.current_size + t.d_size,
                   current_concurrency = c.current_concurrency + t.d_leases,
                   last_served_at = p_now,
                   turn = t.turn,
                   ready_at = CASE
                       WHEN c.current_size + t.d_size <= 0 THEN NULL
                       WHEN c.current_concurrency + t.d_leases >= c.max_concurrency THEN
                           (SELECT greatest(m.dequeue_at, p_now + coalesce(c.release_interval_ms, 0),
                                            c.blocked_until)
                              FROM {schema}.message m
                             WHERE m.queue_id = q.id AND m.channel = c.name AND m.leased
                             ORDER BY m.dequeue_at LIMIT 1)
                       ELSE
                           (SELECT greatest(m.dequeue_at, p_now + coalesce(c.release_interval_ms, 0),
                                            c.blocked_until)
                              FROM {schema}.message m
                             WHERE m.queue_id = q.id AND m.channel = c.name
                             ORDER BY m.dequeue_at, m.id LIMIT 1) END
              FROM (SELECT s.d_size, s.d_leases, s.turn, k.tid
                      FROM (SELECT f.name,
                                   CASE WHEN p_mode = 'lease' THEN 0 ELSE -1 END::bigint AS d_size,
                                   CASE WHEN p_mode = 'lease' THEN (NOT f.leased)::integer
                                        ELSE -(f.leased::integer) END AS d_leases,
                                   nextval('{schema}.channel_turn_seq') AS turn
                              FROM unnest(v_from, v_leased) AS f(name, leased)
                             WHERE f.name IS NOT NULL OFFSET 0) s
                     CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM {schema}.channel x
                                          WHERE x.queue_id = q.id AND x.name = s.name OFFSET 0) k) t
             WHERE c.ctid = t.tid;
            IF p_mode <> 'lease' THEN
                v_open := v_open || ARRAY(SELECT n FROM unnest(v_from) n WHERE n IS NOT NULL);
            END IF;
            -- The cursor moves to the last channel served (the served ones are a prefix, by
            -- key, of the deliverable ones).
            v_at := v_last_at;
            v_turn := v_last_tn;
        END IF;
    END LOOP;
END $$;

-- Lease up to p_limit ready messages (dequeue_at <= now, including expired leases) for
-- p_lease_ms, in (dequeue_at, id) order, skipping rows other transactions hold. Each delivery
-- carries attempt (failures so far + 1) and token (the fencing token for ack/nack/extend).
-- A message whose lease expired on its last allowed attempt is dead-lettered, not delivered.
-- p_ack_ids/p_ack_tokens: acknowledge earlier deliveries in the same transaction first. A
-- paused queue (queue_pause) hands out nothing: only the acks are done.
-- Raises LQ001 (unknown queue), LQ002 (bad limit or lease). Writes message (and channel,
-- archive through _ack/_dead_letter). Locks: the rows it leases, FOR UPDATE SKIP LOCKED.
-- take(queue, 1, ack => previous) is what a one-at-a-time consumer runs for every message, so
-- it has a lean path: the checks run inline and call the raising helper only when they fail,
-- _ack() is called only when there is something to acknowledge, the generation counters are
-- read by one statement, and one message is locked and leased by one UPDATE of its own (830-890
-- us per call through seven nested plpgsql calls, 410-455 us with a candidate query and an
-- UPDATE by key, PostgreSQL 15; one statement less again since). Batches, channel queues, and
-- a take(1) that leased nothing (an empty queue, a message at its last attempt) take the
-- general path (_lock_ready, _deliver), with the same semantics; so does a batch that leased
-- fewer than asked while a rotation is unsettled for it (generations.sql, "The rotor": the
-- general path reads the generation it pushes out of the window; the lean statements do not).
-- Pinned plans (also take_tx): generic ones (see settle.sql's header), and no sort where an
-- index gives the order (enable_sort = off; jit = off, which the cost of an unavoidable sort
-- would otherwise trigger): with statistics taken while a snapshot was held, the generic plan
-- of the candidate query appended both partitions of the message table and sorted every ready
-- message of the window (172,510 of them, a 14 MB external sort, 234 ms per take) instead of
-- reading the dequeue index in order (4 ms there). take() alone also turns Memoize off (its
-- batch ack's TID scans: a cache that never hits).
CREATE OR REPLACE FUNCTION {schema}.take(
    p_queue      text,
    p_limit      integer DEFAULT 1,
    p_lease_ms   bigint  DEFAULT NULL,
    p_ack_ids    bigint[] DEFAULT NULL,
    p_ack_tokens integer[] DEFAULT NULL,
    p_now        bigint  DEFAULT NULL
) RETURNS SETOF {schema}.delivery
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off SET enable_memoize = off AS $$
DECLARE
    q       {schema}.queue;
    v_now   bigint;
    v_lease bigint;
    v_want  integer := p_limit;
    v_round integer := 0;
    v_ids   bigint[];
    v_dead  bigint[];
    v_gen   bigint;
    v_started bigint;
    v_frozen bigint[];
    v_old   bigint;
    v_held  bigint;
    v_head  record;
    v_acked bigint;
    v_channel text;
    v_got   integer;
    v_channels text[];
    v_n_acked bigint;  -- the batch ack below: the deliveries it deleted
    v_acked1 boolean;  -- the one-delivery drain's statement below acknowledged the delivery
BEGIN
    -- The queue, the clock, the generation counters and the queue's frozen generations, in one
    -- statement (each statement costs a snapshot and an executor start-up; a PL/pgSQL expression
    -- that calls a function that is not immutable takes a snapshot too). The checks of _queue,
    -- _check_limit, _check_positive and _now are called only when they are going to fail. The
    -- frozen generations are looked up only when the frozen flag says a queue may have one
    -- (generations.sql, "The frozen flag": read after this statement's snapshot), by a function
    -- call: a sub-select here, even one a CASE skips, costs its executor start-up at every
    -- call (most of its 22k instructions; docs/benchmarks.md, "A frozen flag in a sequence").
    SELECT x AS q, pg_sequence_last_value('{schema}.message_gen_seq') AS gen,
           -- (NULL until the first rotation sets it: a fresh install's first take is due.)
           coalesce(pg_sequence_last_value('{schema}.message_gen_started_seq'), 0) AS started,
           CASE WHEN pg_sequence_last_value('{schema}.message_gen_frozen_seq') = 0 THEN NULL
                ELSE {schema}._gen_frozen_of(x.id) END AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()
                ELSE {schema}._now(p_now) END AS now
      INTO v_head
      FROM {schema}.queue x
     WHERE x.name = p_queue;
    IF NOT FOUND THEN
        q := {schema}._queue(p_queue);
    END IF;
    q := v_head.q;
    v_now := v_head.now;
    IF p_limit = 1 AND p_ack_ids IS NOT NULL THEN  -- (a test of its own: other calls compile no more)
        IF array_dims(p_ack_ids) = '[1:1]' AND array_dims(p_ack_tokens) = '[1:1]'
           AND q.id >= 0 AND NOT (q.archive OR q.paused OR q.uses_channels)
           AND v_now - v_head.started < 2000 AND coalesce(p_lease_ms, 1) > 0 THEN
            -- A one-at-a-time consumer's drain, take(1, ack=previous), of an ordinary queue
            -- (not paused, no channels, no archiving) with at most one frozen generation, no
            -- rotation due and a valid lease: the one-delivery ack below and take(1)'s lease
            -- below in one statement, decided by one test and the frozen list's (the second
            -- statement and the checks and assignments between the two were 6-7 % of the call's
            -- server instructions: docs/benchmarks.md, "take()'s head, counted"). The arrays hold
            -- one element each ('[1:1]': p_ack_ids[1] is the delivery). The ack's CTEs run after the lease (the
            -- main statement), so the lease leaves the acknowledged message alone: an expired
            -- lease first in line would otherwise be leased again by the statement that
            -- acknowledges it (whose DELETE then skips the row it changed). Then nothing is
            -- leased here, and the general path below leases, in a statement of its own, the
            -- next message (or this one again, its token having been stale). Nothing deleted
            -- (a repeat, a stale token): nothing more to do (ack() would answer the pair, which
            -- take discards, and change nothing). The lease is take(1)'s (keep the two in step).
            -- Two copies of the statement (keep them in step): without a frozen generation (the
            -- common case) the window's two candidate ranges; with the queue's one frozen
            -- generation, that generation as a third range, merged as the batch's statement
            -- below merges it: a drain that outlasts two rotations has its backlog frozen
            -- (generations.sql) for the rest of its run, and took the general path's three
            -- statements for every message until it thawed (docs/benchmarks.md, "A frozen
            -- backlog's one-at-a-time drain and pop"). One statement for both, the third range
            -- empty without one, cost the common drain 1.4 % of its instructions (docs/benchmarks.md,
            -- "Two copies of the lean drain and pop"). Two or more frozen generations: neither
            -- copy (the general path below); each copy tests its own FOUND (an IF that ran
            -- neither would read the head's).
            IF v_head.frozen IS NULL THEN
                RETURN QUERY
                WITH d AS (
                    DELETE FROM {schema}.message_logged m
                     WHERE m.queue_id = q.id AND m.id = p_ack_ids[1] AND m.deliveries = p_ack_tokens[1]
                       AND m.leased IS TRUE
                    RETURNING m.id, m.deliveries
                ), k AS (
                    INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
                    SELECT q.id, d.id, d.deliveries, 'acked', v_now FROM d
                ), st AS (
                    INSERT INTO {schema}.queue_stat (queue_id, minute, acked)
                    SELECT q.id, v_now / 60000, 1 FROM d
                )
                UPDATE {schema}.message_logged m
                   SET dequeue_at = v_now + coalesce(p_lease_ms, q.lease_ms), attempts = m.attempts + 1,
                       deliveries = m.deliveries + 1, leased = true
                 WHERE m.ctid = (SELECT c.tid
                                   FROM (SELECT w.tid, w.ok
                                           FROM (VALUES (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                          CROSS JOIN LATERAL (
                                                SELECT m.id, m.ctid AS tid, m.dequeue_at,
                                                       m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                  FROM {schema}.message_logged m
                                                 WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                                   AND m.dequeue_at <= v_now
                                                 ORDER BY m.dequeue_at, m.id
                                                 LIMIT p_limit
                                                   FOR UPDATE SKIP LOCKED) w
                                          ORDER BY w.dequeue_at, w.id
                                          LIMIT 1) c
                                  WHERE c.ok)
                   AND m.id <> ALL (p_ack_ids)
                RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                          m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                          m.last_error, m.payload;
                IF FOUND THEN
                    RETURN;
                END IF;
                v_acked1 := true;
            ELSIF cardinality(v_head.frozen) = 1 THEN
                RETURN QUERY
                WITH d AS (
                    DELETE FROM {schema}.message_logged m
                     WHERE m.queue_id = q.id AND m.id = p_ack_ids[1] AND m.deliveries = p_ack_tokens[1]
                       AND m.leased IS TRUE
                    RETURNING m.id, m.deliveries
                ), k AS (
                    INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
                    SELECT q.id, d.id, d.deliveries, 'acked', v_now FROM d
                ), st AS (
                    INSERT INTO {schema}.queue_stat (queue_id, minute, acked)
                    SELECT q.id, v_now / 60000, 1 FROM d
                )
                UPDATE {schema}.message_logged m
                   SET dequeue_at = v_now + coalesce(p_lease_ms, q.lease_ms), attempts = m.attempts + 1,
                       deliveries = m.deliveries + 1, leased = true
                 WHERE m.ctid = (SELECT c.tid
                                   FROM (SELECT w.tid, w.ok
                                           FROM (VALUES (v_head.frozen[1]), (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                          CROSS JOIN LATERAL (
                                                SELECT m.id, m.ctid AS tid, m.dequeue_at,
                                                       m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                  FROM {schema}.message_logged m
                                                 WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                                   AND m.dequeue_at <= v_now
                                                 ORDER BY m.dequeue_at, m.id
                                                 LIMIT p_limit
                                                   FOR UPDATE SKIP LOCKED) w
                                          ORDER BY w.dequeue_at, w.id
                                          LIMIT 1) c
                                  WHERE c.ok)
                   AND m.id <> ALL (p_ack_ids)
                RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                          m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                          m.last_error, m.payload;
                IF FOUND THEN
                    RETURN;
                END IF;
                v_acked1 := true;
            END IF;  -- (two or more frozen generations: the general path)
        END IF;
    END IF;
    v_gen := v_head.gen;
    v_started := v_head.started;
    v_frozen := v_head.frozen;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM {schema}._check_limit(p_limit);
    END IF;
    IF p_lease_ms <= 0 THEN
        PERFORM {schema}._check_positive(p_lease_ms, 'lease_ms');
    END IF;
    v_lease := coalesce(p_lease_ms, q.lease_ms);

    -- Keep the generations moving (generations.sql) when one is due: not in a caller's
    -- transaction, whose end would hold the rows moved: none that has written anything or
    -- started more than 100 ms before this statement. (Not "statement_timestamp() =
    -- transaction_timestamp()": over the extended protocol, which every driver with parameters
    -- uses, the transaction starts at Bind and the statement at Execute, so that never held and
    -- take never rotated.) The test of the clock first: it calls no function.
    IF v_now - v_started >= 2000 THEN
        IF pg_current_xact_id_if_assigned() IS NULL
           AND statement_timestamp() - transaction_timestamp() < interval '100 milliseconds' THEN
            PERFORM {schema}.rotate(p_now => v_now);
            SELECT s.last_value,
                   CASE WHEN pg_sequence_last_value('{schema}.message_gen_frozen_seq') = 0 THEN NULL
                        ELSE {schema}._gen_frozen_of(q.id) END  -- (as the head reads them)
              INTO v_gen, v_frozen
              FROM {schema}.message_gen_seq s;
        END IF;
    END IF;

    IF p_ack_ids IS NULL OR v_acked1 THEN
        NULL;  -- (nothing to acknowledge, or acknowledged above)
    ELSIF cardinality(p_ack_ids) = 1 AND cardinality(p_ack_tokens) = 1 AND NOT q.archive THEN
        -- One delivery of a queue without archiving (a consumer's drain, take(1, ack=previous)): the
        -- statement of ack's one-delivery path, here, on the queue already read (a nested call
        -- of ack() cost its frame, its settings and its queue lookup again). Nothing deleted (a
        -- repeat, a stale token): ack() itself, which answers those as before. (Tried in
        -- message_logged, as the lease below: 2 % less for an ordinary queue's drain, but an
        -- UNLOGGED queue's ack would then need a copy of this statement or ack()'s frame.)
        WITH d AS (
            DELETE FROM {schema}.message m
             WHERE m.queue_id = q.id AND m.id = p_ack_ids[1] AND m.deliveries = p_ack_tokens[1]
               AND m.leased IS TRUE
            RETURNING m.queue_id, m.id, m.deliveries, m.channel
        ), k AS (
            INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
            SELECT d.queue_id, d.id, d.deliveries, 'acked', v_now FROM d
        ), st AS (
            INSERT INTO {schema}.queue_stat (queue_id, minute, acked)
            SELECT d.queue_id, v_now / 60000, 1 FROM d
        )
        SELECT d.id, d.channel INTO v_acked, v_channel FROM d;  -- (one row at most)
        IF v_acked IS NULL THEN
            PERFORM {schema}.ack(p_queue, p_ack_ids, p_ack_tokens, false, p_now);
        ELSIF v_channel IS NOT NULL THEN
            -- The message leaves its channel (its row locked after the message's, as _ack
            -- does): _channel_apply_one's UPDATE, here (a nested _ack, _channel_apply and
            -- _channel_apply_one cost a frame and a statement each). It may wait for the row
            -- (a take_tx in flight holds it), so ready_at is _channel_ready_at's (a fresh
            -- snapshot after the wait). Anything else (no row: counters lost to a crash; an
            -- empty channel to delete) is _channel_apply_one's.
            UPDATE {schema}.channel c
               SET current_size = c.current_size - 1,
                   current_concurrency = c.current_concurrency - 1,
                   ready_at = {schema}._channel_ready_at(
                       c.queue_id, c.name, c.current_size - 1, c.current_concurrency - 1,
                       c.max_concurrency, c.last_served_at, c.release_interval_ms, c.blocked_until)
             WHERE c.queue_id = q.id AND c.name = v_channel
               AND (c.current_size <> 1 OR c.explicit
                    OR coalesce(c.last_served_at + c.release_interval_ms, 0) > v_now
                    OR coalesce(c.blocked_until, 0) > v_now);
            IF NOT FOUND THEN
                PERFORM {schema}._channel_apply_one(q, v_channel, -1, -1, v_now);
            END IF;
        END IF;
    ELSIF p_ack_ids IS NOT NULL AND NOT q.archive AND q.id >= 0
          AND cardinality(p_ack_ids) = cardinality(p_ack_tokens)
          AND p_ack_tokens[1] = ALL (p_ack_tokens) THEN
        -- A batch of one token of an ordinary queue without archiving (a drain's take(n,
        -- ack=previous): its deliveries' first attempts carry a token each of 1): the
        -- deliveries deleted here, in one statement, without _ack's frame, its lock of each row
        -- first and its second statement. The ids in order, each row found by its key (a
        -- LATERAL probe, kept one by its LIMIT 1, which also ends the index scan at the key's
        -- visible row instead of reading on to the next key: 3 % of a drain's instructions at
        -- batch 100) and deleted by its ctid in that order: a nested loop of TID scans, the only
        -- plan without a read of the whole table (which enable_seqscan = off prices out; no
        -- index is ordered by ctid), so the rows are locked in id order, as every settle locks
        -- them (settle.sql's header). The probes' join stays one subquery (OFFSET 0): the
        -- DELETE then carries one whole-row copy of its other relation per row, for a recheck
        -- after a wait, not one of each of the two (1.4 %; docs/benchmarks.md, "take()'s batch
        -- ack, row by row"). Left over (fewer rows deleted than pairs): repeats, stale tokens,
        -- and a row another transaction changed while this statement waited for it
        -- (PostgreSQL's recheck of the TID scan refuses its new version, which this
        -- transaction now holds): _ack, the general path, is given every pair and deals with
        -- those (it locks each by key, sees the new version, deletes it if it is still the
        -- delivery's; a row deleted here is gone for its snapshot, so it finds no row for
        -- those: the count is all this path needs, not an array of the ids). The messages
        -- with a channel leave it after the messages, as _ack does. (enable_memoize = off, in
        -- take's SET clauses: the planner put a Memoize over the TID scans, which never hits,
        -- every ctid differing: 2k instructions a message at batch 100, the setting 3k a call.)
        -- Server instructions per message against _ack's two statements: 0.968 at batch 100,
        -- 0.946 at batch 10 (docs/benchmarks.md, "A drain's batch ack in take's own statement").
        -- One token: the ids are sorted alone and the token is a parameter of each probe and of
        -- the DELETE's check. A sort of one column sorts plain values, not tuples (PostgreSQL's
        -- Datum sort), and an unnest in the select list streams its values into the sort where
        -- one in FROM first writes them to a tuplestore: 0.982 of a drain's server instructions
        -- at batch 100, 0.987 at batch 10 (docs/benchmarks.md, "A one-token batch ack"). A batch
        -- of mixed tokens (redeliveries among first attempts) goes to _ack, below, whole: a
        -- second copy of this statement for the pairs' sort cost ~3 % less than _ack there, not
        -- worth a statement kept in step. (Tried and not kept: one index scan of the primary key
        -- with "id = ANY (p_ack_ids)", 0.963 and 0.925: in PostgreSQL 15 and 16 its plan is the
        -- planner's choice between that scan and one of the queue's part of the key with the ids
        -- as a filter, which it takes on the statistics of a small table and which reads every
        -- row of the queue, or a bitmap scan, which deletes in ctid order.)
        WITH d AS (
            DELETE FROM {schema}.message_logged m
             USING (SELECT k.tid
                      FROM (SELECT unnest(p_ack_ids) AS id ORDER BY 1) t
                     CROSS JOIN LATERAL (SELECT p.ctid AS tid FROM {schema}.message_logged p
                                          WHERE p.queue_id = q.id AND p.id = t.id
                                            AND p.deliveries = p_ack_tokens[1] AND p.leased IS TRUE
                                         LIMIT 1) k
                    OFFSET 0) k
             WHERE m.ctid = k.tid AND m.deliveries = p_ack_tokens[1] AND m.leased IS TRUE
               AND (m.queue_id = q.id) IS TRUE
            RETURNING m.id, m.deliveries, m.channel
        ), k AS (
            INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
            SELECT q.id, d.id, d.deliveries, 'acked', v_now FROM d
        ), st AS (
            INSERT INTO {schema}.queue_stat (queue_id, minute, acked)
            SELECT q.id, v_now / 60000, count(*) FROM d HAVING count(*) > 0
        )
        SELECT count(*), array_agg(d.channel) FILTER (WHERE d.channel IS NOT NULL)
          INTO v_n_acked, v_channels
          FROM d;
        IF v_n_acked < cardinality(p_ack_ids) THEN
            PERFORM {schema}._ack(q, p_ack_ids, p_ack_tokens, false, v_now);
        END IF;
        IF v_channels IS NOT NULL THEN
            PERFORM {schema}._channel_apply(q, v_channels,
                array_fill(-1::bigint, ARRAY[cardinality(v_channels)]),
                array_fill(-1, ARRAY[cardinality(v_channels)]), v_now);
        END IF;
    ELSIF p_ack_ids IS NOT NULL THEN
        PERFORM {schema}._ack(q, p_ack_ids, p_ack_tokens, q.archive, v_now);
    END IF;
    -- A paused queue (queue_pause) hands out nothing; the acks above still count.
    IF q.paused THEN
        RETURN;
    END IF;

    IF q.uses_channels THEN
        RETURN QUERY SELECT * FROM {schema}._take_channels(q, p_limit, v_lease, v_now, 'lease');
        RETURN;
    END IF;

    -- One message: _lock_ready's candidate queries for one row and _deliver's lease of it, in
    -- one statement: the first ready row of the queue's frozen generations, oldest first (a
    -- backlog), is locked first; the UPDATE then leases, by ctid (as take_tx's lean path
    -- deletes; see there), the first of it and the first row of each generation of the window,
    -- if it may be delivered. Nothing leased (an empty queue; a candidate whose lease expired
    -- on its last attempt, or a superseded version whose lease expired; a row changed and
    -- committed by another transaction between this statement's start and its lock): the
    -- general path below, which sees the rows this one locked, deals with them and looks
    -- further: an empty queue's take(1) thus runs a few statements more than before, every
    -- delivering one a statement less (a statement's executor start-up over the partitioned
    -- message table is most of a take's server time). (Its window query says LIMIT p_limit,
    -- which is 1 here: the batch's statement below reads the window with the same query, and
    -- tests/sql/test_plans.py tests each distinct query once.)
    IF p_limit = 1 THEN
        FOREACH v_old IN ARRAY coalesce(v_frozen, ARRAY[]::bigint[]) LOOP
            SELECT x.id INTO v_held
              FROM (SELECT m.id FROM {schema}.message m
                     WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                       AND m.dequeue_at <= v_now
                     ORDER BY m.dequeue_at, m.id
                     LIMIT 1
                       FOR UPDATE SKIP LOCKED) x;
            EXIT WHEN v_held IS NOT NULL;
        END LOOP;
        IF v_held IS NULL AND q.id >= 0 THEN
            -- No frozen row (no backlog in the queue's frozen generations) of an ordinary queue:
            -- the statement below without its array, union and sort (7 % of take(1)'s
            -- instructions, benchmarks/server_instructions.py), in message_logged, the
            -- partition of every ordinary queue (queues.sql), by name: an UPDATE of the
            -- partitioned table opens both partitions and all their indexes (its TIDs cannot
            -- be pruned): 2.4 % of a drain's instructions. Keep the two in step.
            RETURN QUERY
            UPDATE {schema}.message_logged m
               SET dequeue_at = v_now + v_lease, attempts = m.attempts + 1,
                   deliveries = m.deliveries + 1, leased = true
             WHERE m.ctid = (SELECT c.tid
                               FROM (SELECT w.tid, w.ok
                                       FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                      CROSS JOIN LATERAL (
                                            SELECT m.id, m.ctid AS tid, m.dequeue_at,
                                                   m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                              FROM {schema}.message_logged m
                                             WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                               AND m.dequeue_at <= v_now
                                             ORDER BY m.dequeue_at, m.id
                                             LIMIT p_limit
                                               FOR UPDATE SKIP LOCKED) w
                                      ORDER BY w.dequeue_at, w.id
                                      LIMIT 1) c
                              WHERE c.ok)
            RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
        ELSIF v_held IS NULL THEN
            -- The same of an UNLOGGED queue, over the partitioned table (by ctid: the TIDs of
            -- the queue's partition, see settle.sql).
            RETURN QUERY
            UPDATE {schema}.message m
               SET dequeue_at = v_now + v_lease, attempts = m.attempts + 1,
                   deliveries = m.deliveries + 1, leased = true
             WHERE m.ctid = (SELECT c.tid
                               FROM (SELECT w.tid, w.ok
                                       FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                      CROSS JOIN LATERAL (
                                            SELECT m.id, m.ctid AS tid, m.dequeue_at,
                                                   m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                              FROM {schema}.message m
                                             WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                               AND m.dequeue_at <= v_now
                                             ORDER BY m.dequeue_at, m.id
                                             LIMIT p_limit
                                               FOR UPDATE SKIP LOCKED) w
                                      ORDER BY w.dequeue_at, w.id
                                      LIMIT 1) c
                              WHERE c.ok)
               AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
            RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
        ELSE
            RETURN QUERY
            UPDATE {schema}.message m
               SET dequeue_at = v_now + v_lease, attempts = m.attempts + 1,
                   deliveries = m.deliveries + 1, leased = true
             WHERE m.ctid = ANY (ARRAY(
                   SELECT c.tid
                     FROM (SELECT x.tid, x.ok
                             FROM ((SELECT w.*
                                      FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                     CROSS JOIN LATERAL (
                                           SELECT m.id, m.ctid AS tid, m.dequeue_at,
                                                  m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                             FROM {schema}.message m
                                            WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                              AND m.dequeue_at <= v_now
                                            ORDER BY m.dequeue_at, m.id
                                            LIMIT p_limit
                                              FOR UPDATE SKIP LOCKED) w)
                                   UNION ALL
                                   (SELECT m.id, m.ctid, m.dequeue_at,
                                           m.attempts < q.max_attempts AND m.superseded_by IS NULL
                                      FROM {schema}.message m
                                     WHERE m.queue_id = q.id AND m.id = v_held)) x
                            ORDER BY x.dequeue_at, x.id
                            LIMIT 1) c
                    WHERE c.ok))
               AND (m.queue_id = q.id) IS TRUE  -- (the TIDs of the queue's partition: settle.sql)
            RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
        END IF;
        IF FOUND THEN
            RETURN;
        END IF;
    ELSIF coalesce(cardinality(v_frozen), 0) <= 1 THEN
        -- A batch of a queue with at most one frozen generation (a drain's take(n, ack=previous)):
        -- _lock_ready's candidate query and _deliver's lease in one statement, as take(1)'s
        -- above: the window's candidates are locked in (dequeue_at, id) order and those that
        -- may be delivered are leased by their ctid (which stays put while we hold the row).
        -- No probe of the primary key per row, no arrays handed between nested calls, no copy
        -- of each row through their result sets, a CTE and a sort: a sixth fewer server
        -- instructions per message of a drain at batch 100 (docs/benchmarks.md). The rows
        -- come out in the order of the array, without a sort: an UPDATE returns its rows in
        -- the order its join makes them, and the only join here without a scan of the whole
        -- table (which enable_seqscan = off prices out) is a nested loop over the array, each
        -- element fetched by a TID scan (tests/sql/test_take_lean.py tests that plan and the
        -- order). In message_logged for an ordinary queue, over the partitioned table for an
        -- UNLOGGED one (as take(1)'s). A row changed and committed by another transaction
        -- between this statement's start and its lock is locked in a version the UPDATE's
        -- snapshot does not see: not leased by this call (as take_tx's lean path). Fewer than
        -- asked: the general path only when a candidate may not be delivered (an expired
        -- lease on its last attempt, or superseded: the partial index of leases, which holds
        -- the frozen generations' leases too). The queue's one frozen
        -- generation (a backlog older than the window: a drain that outlasts two rotations)
        -- is a third candidate range, merged as _lock_ready merges it: _lock_ready locks up to
        -- p_limit of its rows, then the window's, and keeps the first p_limit of them all by
        -- (dequeue_at, id), the same rows as here (v_frozen[1] is NULL without one: its range
        -- is empty, an index scan that stops at once). With two or more, _lock_ready's order
        -- (the oldest generation first) is not a merge: the general path.
        IF q.id >= 0 THEN
            RETURN QUERY
            UPDATE {schema}.message_logged m
               SET dequeue_at = v_now + v_lease, attempts = m.attempts + 1,
                   deliveries = m.deliveries + 1, leased = true
              FROM unnest(ARRAY(
                       SELECT c.tid
                         FROM (SELECT w.tid, w.ok, w.dequeue_at, w.id
                                 FROM (VALUES (v_frozen[1]), (v_gen - 1), (v_gen)) AS g(gen)
                                CROSS JOIN LATERAL (
                                      SELECT m.id, m.ctid AS tid, m.dequeue_at,
                                             m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                        FROM {schema}.message_logged m
                                       WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                         AND m.dequeue_at <= v_now
                                       ORDER BY m.dequeue_at, m.id
                                       LIMIT p_limit
                                         FOR UPDATE SKIP LOCKED) w
                                ORDER BY w.dequeue_at, w.id
                                LIMIT p_limit) c
                        WHERE c.ok
                        ORDER BY c.dequeue_at, c.id)) AS t(tid)
             WHERE m.ctid = t.tid
            RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
        ELSE
            RETURN QUERY
            UPDATE {schema}.message m
               SET dequeue_at = v_now + v_lease, attempts = m.attempts + 1,
                   deliveries = m.deliveries + 1, leased = true
              FROM unnest(ARRAY(
                       SELECT c.tid
                         FROM (SELECT w.tid, w.ok, w.dequeue_at, w.id
                                 FROM (VALUES (v_frozen[1]), (v_gen - 1), (v_gen)) AS g(gen)
                                CROSS JOIN LATERAL (
                                      SELECT m.id, m.ctid AS tid, m.dequeue_at,
                                             m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                        FROM {schema}.message m
                                       WHERE m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL
                                         AND m.dequeue_at <= v_now
                                       ORDER BY m.dequeue_at, m.id
                                       LIMIT p_limit
                                         FOR UPDATE SKIP LOCKED) w
                                ORDER BY w.dequeue_at, w.id
                                LIMIT p_limit) c
                        WHERE c.ok
                        ORDER BY c.dequeue_at, c.id)) AS t(tid)
             WHERE m.ctid = t.tid AND (m.queue_id = q.id) IS TRUE  -- (the queue's partition)
            RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
        END IF;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_want := p_limit - v_got;
        IF v_want <= 0 THEN  -- (a test of its own: a condition with a subquery is a statement)
            RETURN;
        END IF;
        -- Fewer than asked: the general path also when a rotation is unsettled or the frozen
        -- list changed since the head (generations.sql, "The rotor": ready rows in the
        -- generation leaving the window that this statement could not see).
        IF NOT {schema}._undeliverable_ready(q, v_now) AND NOT {schema}._gen_unsettled(q.id, v_frozen) THEN
            RETURN;
        END IF;
    END IF;

    -- The general path: messages found dead do not count against p_limit.
    LOOP
        SELECT r.ids, r.dead INTO v_ids, v_dead FROM {schema}._lock_ready(q, v_want, v_now) r;
        IF v_ids IS NOT NULL THEN
            -- Leased rows move past v_now, so a further round cannot select them again.
            RETURN QUERY SELECT * FROM {schema}._deliver(q, v_ids, 'lease', v_lease, v_now);
        END IF;
        v_want := v_want - coalesce(cardinality(v_ids), 0);
        v_round := v_round + 1;
        EXIT WHEN v_dead IS NULL OR v_want <= 0 OR v_round >= 10;
    END LOOP;
END $$;

-- Exactly-once with the caller's work: deletes (or archives) up to p_limit ready messages inside
-- the caller's transaction, in (dequeue_at, id) order, skipping rows others hold. Commit
-- consumes them; rollback puts them back untouched. A paused queue (queue_pause) returns
-- nothing. As in take(), a message whose lease expired on its last attempt is dead-lettered,
-- not delivered, and a superseded version whose lease expired is deleted; neither counts
-- against p_limit. Raises LQ001 (unknown queue), LQ002 (bad limit). Writes message (and
-- archive, channel, the dead letters' tables through _take_channels, _dead_letter). Locks: the
-- rows it takes, FOR UPDATE SKIP LOCKED (rows beyond p_limit may stay locked until the
-- transaction ends, as in _lock_ready).
-- The plain queue without archiving (pop) has a lean path: one DELETE of the messages that a
-- sub-select locks over the window's two generations (and the rows already locked in the
-- queue's frozen generations, oldest first, when it has a backlog: read as _lock_ready does),
-- RETURNING them: no lease is written, no nested call is made. The rows go in by ctid, as an
-- array (ctid = ANY (ARRAY(...)): a TID scan, never a join planned from statistics, which under
-- a held snapshot read every entry the queue left in the primary key: 5,010 for a take_tx(5)
-- by (queue_id, id = ANY (...)); see settle.sql's header and tests/sql/test_plans.py). A row
-- that another transaction changed and committed after the statement began, and before the
-- sub-select locked it (a replace, a nack of an expired lease: rare), is locked in its new
-- version, which the DELETE's snapshot does not see: it is not delivered by this call and stays
-- locked until the transaction ends, untouched. A candidate that may not be delivered (dead or
-- superseded: always an expired lease) is left locked; when the statement delivered fewer than
-- p_limit and the queue has such a lease, or a rotation is unsettled for it (generations.sql,
-- "The rotor": _gen_unsettled), the general path (_lock_ready, _deliver) deals with it and
-- goes on. Writes nothing else: a pop hands out no token, so it leaves no settled row
-- (ack's memory of a token) and counts nothing in queue_stat (which counts sends, acks, nacks,
-- dead letters and cancels); the pop floor of benchmarks/server_instructions.py is this DELETE
-- alone, as one plain statement.
-- The commonest call, pop (one message of an ordinary queue, not paused, no channels, no
-- archiving, no frozen generation), is decided by the first statement and runs its DELETE
-- next, before any other statement or expression of the function.
-- Pinned plans as in take().
CREATE OR REPLACE FUNCTION {schema}.take_tx(
    p_queue   text,
    p_limit   integer DEFAULT 1,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF {schema}.delivery
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
DECLARE
    q          {schema}.queue;
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
    v_lean_tried boolean;  -- the lean pop below ran and delivered nothing
BEGIN
    -- The queue, the clock, the generation counter and the queue's frozen generations (only
    -- when the frozen flag says a queue may have one, as in take()), in one statement, as in
    -- take(), and whether the call may take the lean pop below (lean, with no frozen
    -- generation). The checks of _queue, _check_limit and _now are called only when they are
    -- going to fail.
    SELECT x AS q, x.id AS qid, x.max_attempts AS max_attempts,
           pg_sequence_last_value('{schema}.message_gen_seq') AS gen,
           CASE WHEN pg_sequence_last_value('{schema}.message_gen_frozen_seq') = 0 THEN NULL
                ELSE {schema}._gen_frozen_of(x.id) END AS frozen,
           CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint  -- now_ms()
                ELSE {schema}._now(p_now) END AS now,
           p_limit = 1 AND x.id >= 0 AND NOT x.paused
               AND NOT x.uses_channels AND NOT coalesce(p_archive, x.archive) AS lean
      INTO v_head
      FROM {schema}.queue x
     WHERE x.name = p_queue;
    IF v_head.lean AND v_head.frozen IS NULL THEN
        -- One message of an ordinary queue (not paused, no channels, no archiving) without a
        -- frozen generation: the common pop. (With the queue's one frozen generation, the copy
        -- below reads it as a third candidate range, as take()'s one-statement drain does; keep
        -- the two in step: one statement for both cost the common pop 2.6 %, docs/benchmarks.md,
        -- "Two copies of the lean drain and pop".) Every PL/pgSQL statement and expression costs its
        -- own checks (2-3k instructions each: the checks and assignments below, evaluated
        -- first, were 5 % of a pop; benchmarks/server_instructions.py), so nothing else runs
        -- before it. The general path's statement without its array and union: the first of
        -- the window's two candidates is deleted by ctid if it may be delivered (CASE: no
        -- subquery scan to filter it, 1.7 %); in message_logged, the partition of every
        -- ordinary queue (queues.sql), by name, as take(1)'s lease (keep the two in step).
        -- Nothing deleted (an empty queue, a candidate that may not be delivered, a row
        -- changed under the statement): on below (v_lean_tried), which looks for what the
        -- general path must deal with.
        RETURN QUERY
        DELETE FROM {schema}.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                                   FROM (VALUES (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM {schema}.message_logged m
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
        v_lean_tried := true;
    ELSIF v_head.lean AND cardinality(v_head.frozen) = 1 THEN
        -- The same with the queue's one frozen generation (a backlog older than the window) as
        -- a third candidate range, merged by (dequeue_at, id) as _lock_ready merges it.
        RETURN QUERY
        DELETE FROM {schema}.message_logged m
         WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                                   FROM (VALUES (v_head.frozen[1]), (v_head.gen - 1), (v_head.gen)) AS g(gen)
                                  CROSS JOIN LATERAL (
                                        SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                               m.attempts < v_head.max_attempts AND m.superseded_by IS NULL AS ok
                                          FROM {schema}.message_logged m
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
        v_lean_tried := true;
    END IF;
    IF v_head.qid IS NULL THEN  -- no such queue
        q := {schema}._queue(p_queue);
    END IF;
    q := v_head.q;
    v_now := v_head.now;
    v_gen := v_head.gen;
    v_frozen := v_head.frozen;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM {schema}._check_limit(p_limit);
    END IF;
    v_archive := coalesce(p_archive, q.archive);
    v_want := p_limit;
    IF q.paused THEN  -- queue_pause: nothing is handed out
        RETURN;
    END IF;
    IF q.uses_channels THEN
        -- The channel row stays locked until the caller's transaction ends: the channel's
        -- messages taken here count against its max_concurrency while in flight.
        RETURN QUERY SELECT * FROM {schema}._take_channels(q, p_limit, NULL, v_now,
            CASE WHEN v_archive THEN 'archive' ELSE 'delete' END);
        RETURN;
    END IF;

    IF NOT v_archive THEN
        IF v_lean_tried THEN
            v_got := 0;  -- the lean pop above delivered nothing
        ELSIF p_limit = 1 AND coalesce(cardinality(v_frozen), 0) = 0 THEN
            -- The same of an UNLOGGED queue, over the partitioned table (by ctid: the TIDs of
            -- the queue's partition, see settle.sql).
            RETURN QUERY
            DELETE FROM {schema}.message m
             WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END  -- (no row: NULL)
                               FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                              CROSS JOIN LATERAL (
                                    SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                           m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                      FROM {schema}.message m
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
                          FROM {schema}.message m
                         WHERE m.gen = v_old AND m.queue_id = q.id AND m.channel IS NULL
                           AND m.dequeue_at <= v_now
                         ORDER BY m.dequeue_at, m.id
                         LIMIT v_more
                           FOR UPDATE SKIP LOCKED) x;
            END LOOP;
            RETURN QUERY
            WITH d AS (
                DELETE FROM {schema}.message m
                 WHERE m.ctid = ANY (ARRAY(
                       SELECT c.tid
                         FROM (SELECT x.tid, x.ok
                                 FROM ((SELECT w.*
                                          FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
                                         CROSS JOIN LATERAL (
                                               SELECT m.ctid AS tid, m.id, m.dequeue_at,
                                                      m.attempts < q.max_attempts AND m.superseded_by IS NULL AS ok
                                                 FROM {schema}.message m
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
        -- the ready rows (the partial index of leases: usually none), or a rotation is
        -- unsettled or the frozen list changed since the head (as in take()).
        IF NOT {schema}._undeliverable_ready(q, v_now) AND NOT {schema}._gen_unsettled(q.id, v_frozen) THEN
            RETURN;
        END IF;
    END IF;

    -- The general path: archiving, and the rows the lean path may not deliver. Deleted rows
    -- cannot be selected again.
    v_round := 0;
    LOOP
        SELECT r.ids, r.dead INTO v_ids, v_dead FROM {schema}._lock_ready(q, v_want, v_now) r;
        IF v_ids IS NOT NULL THEN
            RETURN QUERY SELECT * FROM {schema}._deliver(q, v_ids,
                CASE WHEN v_archive THEN 'archive' ELSE 'delete' END, NULL, v_now);
        END IF;
        v_want := v_want - coalesce(cardinality(v_ids), 0);
        v_round := v_round + 1;
        EXIT WHEN v_dead IS NULL OR v_want <= 0 OR v_round >= 10;
    END LOOP;
END $$;

-- pgmq's pop: take up to p_limit ready messages and delete them, in the caller's transaction
-- (take_tx without archiving, whatever the queue's archive setting: its lean path on a plain
-- queue). Returns them in (dequeue_at, id) order; a paused queue returns nothing. Raises LQ001,
-- LQ002 as take_tx. Writes and locks as take_tx.
CREATE OR REPLACE FUNCTION {schema}.pop(p_queue text, p_limit integer DEFAULT 1, p_now bigint DEFAULT NULL)
RETURNS SETOF {schema}.delivery
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM {schema}.take_tx(p_queue, p_limit, false, p_now);
END $$;

-- Look at the next messages in delivery order without leasing them.
CREATE OR REPLACE FUNCTION {schema}.peek(p_queue text, p_limit integer DEFAULT 10, p_now bigint DEFAULT NULL)
RETURNS SETOF {schema}.delivery
LANGUAGE plpgsql STABLE AS $$
-- p_now is unused on purpose: peek lists every message whatever the time (ready, scheduled and
-- leased, in delivery order), so it needs no clock. The parameter stays so peek is called like
-- take and next_ready_in (tests drive all three with one p_now), and dropping it would change
-- the signature. An unused parameter is a finding about the whole function, which only the
-- in-comment option reaches.
-- @plpgsql_check_options: extra_warnings = false
DECLARE
    q {schema}.queue := {schema}._queue(p_queue);
BEGIN
    PERFORM {schema}._check_limit(p_limit);
    -- Plain messages from their index, channel messages from the head of each channel.
    RETURN QUERY
    SELECT m.id, m.attempts, m.deliveries,
           CASE WHEN m.leased THEN m.dequeue_at END, m.scheduled_at, m.enqueued_at, m.priority,
           m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload
      FROM ((SELECT p.* FROM unnest({schema}._gens_of(q.id)) AS g(gen)
              CROSS JOIN LATERAL (SELECT x.* FROM {schema}.message x
                                   WHERE x.gen = g.gen AND x.queue_id = q.id AND x.channel IS NULL
                                   ORDER BY x.dequeue_at, x.id LIMIT p_limit) p)
            UNION ALL
            (SELECT h.* FROM {schema}.channel c
               CROSS JOIN LATERAL (SELECT x.* FROM {schema}.message x
                                    WHERE x.queue_id = q.id AND x.channel = c.name
                                    ORDER BY x.dequeue_at, x.id LIMIT p_limit) h
              WHERE c.queue_id = q.id AND q.uses_channels)) m
     ORDER BY m.dequeue_at, m.id
     LIMIT p_limit;
END $$;

-- Milliseconds until the next message becomes ready (0 if one is ready now, NULL if the queue
-- is empty or paused: queue_resume wakes its waiters), measured on the database clock when the
-- statement started, for pollers.
CREATE OR REPLACE FUNCTION {schema}.next_ready_in(p_queue text, p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q     {schema}.queue := {schema}._queue(p_queue);
    v_now bigint := {schema}._read_now(p_now);  -- STABLE: not the moving _now()
BEGIN
    IF q.paused THEN
        RETURN NULL;
    END IF;
    -- A channel is ready at its ready_at (its head, rate limit and concurrency limit permitting).
    -- (greatest() ignores NULLs: an empty queue must stay NULL, not 'ready now'.)
    RETURN (SELECT CASE WHEN min(x.at) IS NOT NULL THEN greatest(min(x.at) - v_now, 0) END
              FROM ((SELECT h.dequeue_at FROM unnest({schema}._gens_of(q.id)) AS g(gen)
                      CROSS JOIN LATERAL (SELECT m.dequeue_at FROM {schema}.message m
                                           WHERE m.gen = g.gen AND m.queue_id = q.id
                                             AND m.channel IS NULL
                                           ORDER BY m.dequeue_at, m.id LIMIT 1) h)
                    UNION ALL
                    (SELECT c.ready_at FROM {schema}.channel c
                      WHERE c.queue_id = q.id AND c.ready_at IS NOT NULL
                      ORDER BY c.ready_at LIMIT 1)) x(at));
END $$;
