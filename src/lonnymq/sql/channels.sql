-- LonnyMQ channels: named sub-queues served round robin, each within its own policy
-- (concurrency, release interval, size), and the bookkeeping that keeps their counters exact.
-- Their take path is _take_channels (take.sql); the channel table is in the baseline migration.
--
-- Lock order, kept by every function so that concurrent calls cannot deadlock:
--   1. the queue row (only the first channel message of a queue, to set uses_channels);
--   2. message rows (in id order where a call locks several);
--   3. channel rows, in name order;
--   4. then the same for the dead-letter queue (dead-letter chains have no cycles).
-- (channel_recount locks a queue's channel rows without message rows: it only reads messages.)
-- take never waits on rows: it skips channel and message rows others hold (SKIP LOCKED).
-- A channel's ready_at is recomputed by a statement that starts after its row is locked, so its
-- snapshot includes every message change the previous lock holders committed.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Raises LQ002 unless the channel policy is valid: positive max_concurrency and max_size (or
-- NULL: unlimited), release_interval_ms >= 0, on_full 'reject' or 'drop'.
CREATE OR REPLACE FUNCTION {schema}._check_channel_policy(
    p_max_concurrency integer, p_release_interval_ms bigint, p_max_size bigint, p_on_full text
) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM {schema}._check_positive(p_max_concurrency, 'max_concurrency');
    PERFORM {schema}._check_positive(p_max_size, 'max_size');
    IF p_release_interval_ms < 0 THEN
        PERFORM {schema}._invalid('release_interval_ms must be >= 0');
    END IF;
    IF p_on_full IS NULL OR p_on_full NOT IN ('reject', 'drop') THEN
        PERFORM {schema}._invalid('on_full must be reject or drop');
    END IF;
END $$;

-- Raises LQ002 unless p_channel is a channel name (1 to 512 characters).
CREATE OR REPLACE FUNCTION {schema}._check_channel(p_channel text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_channel IS NULL OR length(p_channel) NOT BETWEEN 1 AND 512 THEN
        PERFORM {schema}._invalid('a channel name must have 1 to 512 characters');
    END IF;
END $$;

-- When a channel may deliver next, from its counters and its messages (see the channel table).
-- VOLATILE on purpose although it only reads: a VOLATILE function's queries take a fresh
-- snapshot (a STABLE one's see the calling statement's), so an UPDATE of a channel row that
-- had to wait for the row lock recomputes it (EvalPlanQual) with what the previous holder
-- committed.
CREATE OR REPLACE FUNCTION {schema}._channel_ready_at(
    p_queue_id integer, p_name text, p_size bigint, p_concurrency integer,
    p_max_concurrency integer, p_last_served_at bigint, p_release_interval_ms bigint,
    p_blocked_until bigint
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
-- plpgsql_check suggests STABLE (the function only reads); VOLATILE is intended, see above.
-- Volatility is a finding about the whole function, which only the in-comment option reaches.
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_head bigint;
BEGIN
    IF p_size <= 0 THEN
        RETURN NULL;
    END IF;
    IF p_concurrency >= p_max_concurrency THEN
        SELECT m.dequeue_at INTO v_head FROM {schema}.message m
         WHERE m.queue_id = p_queue_id AND m.channel = p_name AND m.leased
         ORDER BY m.dequeue_at LIMIT 1;
    ELSE
        SELECT m.dequeue_at INTO v_head FROM {schema}.message m
         WHERE m.queue_id = p_queue_id AND m.channel = p_name
         ORDER BY m.dequeue_at, m.id LIMIT 1;
    END IF;
    IF v_head IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN greatest(v_head, p_last_served_at + coalesce(p_release_interval_ms, 0), p_blocked_until);
END $$;

-- Once per queue: from now on take serves it channel by channel.
CREATE OR REPLACE FUNCTION {schema}._channel_enable(p_queue_id integer) RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE {schema}.queue SET uses_channels = true WHERE id = p_queue_id AND NOT uses_channels
$$;

-- Add p_size messages and p_leases leased messages to channel p_name of queue q, creating it
-- with the queue's default policy if missing, and recompute its ready_at; p_blocked_until
-- (optional) holds it until then. Deleted once empty unless explicit or still inside its release
-- interval. Every statement reaches the row by its full key (queue_id, name), an equality the
-- planner always serves with the primary key: a join with the channel table would be planned from
-- the table's statistics, and statistics taken while the queue had few channels (autovacuum's last
-- ANALYZE, or a held snapshot hiding the rows) make it scan every channel of the queue
-- (tests/sql/test_plans.py).
CREATE OR REPLACE FUNCTION {schema}._channel_apply_one(
    q               {schema}.queue,
    p_name          text,
    p_size          bigint,
    p_leases        integer,
    p_now           bigint,
    p_blocked_until bigint DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_empty boolean;
BEGIN
    LOOP
        UPDATE {schema}.channel c
           SET current_size = c.current_size + p_size,
               current_concurrency = c.current_concurrency + p_leases,
               blocked_until = coalesce(p_blocked_until, c.blocked_until),
               ready_at = {schema}._channel_ready_at(
                   c.queue_id, c.name, c.current_size + p_size, c.current_concurrency + p_leases,
                   c.max_concurrency, c.last_served_at, c.release_interval_ms,
                   coalesce(p_blocked_until, c.blocked_until))
         WHERE c.queue_id = q.id AND c.name = p_name
        -- An empty channel keeps its row while its rate limit still applies.
        RETURNING c.current_size = 0 AND NOT c.explicit
                  AND coalesce(c.last_served_at + c.release_interval_ms, 0) <= p_now
                  AND coalesce(c.blocked_until, 0) <= p_now
          INTO v_empty;
        EXIT WHEN FOUND;
        -- Missing (new, or deleted meanwhile): create it, or lock the row a concurrent call
        -- created (WHERE false: an existing row is locked, not rewritten), and update it again.
        INSERT INTO {schema}.channel AS c (queue_id, name, max_concurrency, release_interval_ms,
                                          max_size, on_full, turn)
        VALUES (q.id, p_name, q.channel_max_concurrency, q.channel_release_interval_ms,
                q.channel_max_size, q.channel_on_full, nextval('{schema}.channel_turn_seq'))
        ON CONFLICT (queue_id, name) DO UPDATE SET turn = c.turn WHERE false;
    END LOOP;
    IF v_empty THEN
        DELETE FROM {schema}.channel c WHERE c.queue_id = q.id AND c.name = p_name;
    END IF;
END $$;

-- Add p_sizes (messages) and p_leases (leased messages) to channels p_names of queue q (NULL
-- names are skipped, repeated names add up), as _channel_apply_one does for one channel.
-- Several channels are first created or locked in name order by one statement, then updated by
-- one statement that reaches each row by its full key (a LATERAL probe per name, OFFSET 0 so it
-- is not flattened into a join) and updates it by ctid: plans that do not depend on the channel
-- table's statistics (see _channel_apply_one).
CREATE OR REPLACE FUNCTION {schema}._channel_apply(
    q               {schema}.queue,
    p_names         text[],
    p_sizes         bigint[],
    p_leases        integer[],
    p_now           bigint,
    p_blocked_until bigint[] DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_empty tid[];
BEGIN
    IF cardinality(p_names) = 1 THEN
        IF p_names[1] IS NOT NULL THEN
            PERFORM {schema}._channel_apply_one(q, p_names[1], p_sizes[1], p_leases[1], p_now,
                                                p_blocked_until[1]);
        END IF;
        RETURN;
    END IF;
    -- Create or lock, in name order. WHERE false: an existing row is locked, not rewritten.
    INSERT INTO {schema}.channel AS c (queue_id, name, max_concurrency, release_interval_ms,
                                      max_size, on_full, turn)
    SELECT q.id, n.name, q.channel_max_concurrency, q.channel_release_interval_ms,
           q.channel_max_size, q.channel_on_full, nextval('{schema}.channel_turn_seq')
      FROM (SELECT DISTINCT u.name FROM unnest(p_names) AS u(name) WHERE u.name IS NOT NULL) n
     ORDER BY n.name
    ON CONFLICT (queue_id, name) DO UPDATE SET turn = c.turn WHERE false;
    -- Every row is now locked by this transaction, so none can be deleted under us.
    WITH d AS (
        SELECT u.name, sum(u.size)::bigint AS size, sum(u.leases)::integer AS leases,
               max(u.blocked) AS blocked
          FROM unnest(p_names, p_sizes, p_leases, p_blocked_until) AS u(name, size, leases, blocked)
         WHERE u.name IS NOT NULL
         GROUP BY u.name
    ), t AS (
        SELECT d.*, x.tid
          FROM d CROSS JOIN LATERAL (
              SELECT c.ctid AS tid FROM {schema}.channel c
               WHERE c.queue_id = q.id AND c.name = d.name OFFSET 0) x
    ), u AS (
        UPDATE {schema}.channel c
           SET current_size = c.current_size + t.size,
               current_concurrency = c.current_concurrency + t.leases,
               blocked_until = coalesce(t.blocked, c.blocked_until),
               -- _channel_ready_at's, inline (a plpgsql call and its statement less a
               -- channel): the rows were locked by the INSERT above, so the snapshot of this
               -- statement has every change of their messages (and the UPDATE never waits).
               ready_at = CASE
                   WHEN c.current_size + t.size <= 0 THEN NULL
                   WHEN c.current_concurrency + t.leases >= c.max_concurrency THEN
                       (SELECT greatest(m.dequeue_at, c.last_served_at + coalesce(c.release_interval_ms, 0),
                                        coalesce(t.blocked, c.blocked_until))
                          FROM {schema}.message m
                         WHERE m.queue_id = q.id AND m.channel = c.name AND m.leased
                         ORDER BY m.dequeue_at LIMIT 1)
                   ELSE
                       (SELECT greatest(m.dequeue_at, c.last_served_at + coalesce(c.release_interval_ms, 0),
                                        coalesce(t.blocked, c.blocked_until))
                          FROM {schema}.message m
                         WHERE m.queue_id = q.id AND m.channel = c.name
                         ORDER BY m.dequeue_at, m.id LIMIT 1) END
          FROM t
         WHERE c.ctid = t.tid
        RETURNING c.ctid AS tid, c.current_size, c.explicit, c.last_served_at,
                  c.release_interval_ms, c.blocked_until
    )
    -- An empty channel keeps its row while its rate limit still applies.
    SELECT array_agg(u.tid) FILTER (WHERE u.current_size = 0 AND NOT u.explicit
                                      AND coalesce(u.last_served_at + u.release_interval_ms, 0) <= p_now
                                      AND coalesce(u.blocked_until, 0) <= p_now)
      INTO v_empty
      FROM u;
    IF v_empty IS NOT NULL THEN
        DELETE FROM {schema}.channel c WHERE c.ctid = ANY (v_empty);
    END IF;
END $$;

-- Channel bookkeeping of send_batch: count the created and replaced messages into their
-- channels, enforce max_size, and return the final (ord, id, outcome) rows. A channel over its
-- max_size after the batch (and grown by it) rejects the whole batch (ChannelFull, LQ007) or,
-- with on_full = 'drop', loses the batch's newest messages over the limit (outcome 'dropped').
-- A replace that moves a message into a full channel is never dropped.
CREATE OR REPLACE FUNCTION {schema}._channel_send(
    q              {schema}.queue,
    p_channels     text[],
    p_ords         bigint[],
    p_ids          bigint[],
    p_outcomes     text[],
    p_old_ids      bigint[],
    p_old_channels text[],
    p_old_leased   boolean[],
    p_now          bigint
) RETURNS TABLE (ord bigint, id bigint, outcome text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_names  text[];
    v_sizes  bigint[];
    v_leases integer[];
    v_full   record;
    v_drop   bigint[] := ARRAY[]::bigint[];
    v_gone   text[];
BEGIN
    -- Join by ordinality, never p_channels[i]: subscripting a text[] walks it, O(n^2) per batch.
    WITH r AS (
        SELECT r.ord, r.id, r.outcome, c.channel
          FROM unnest(p_ords, p_ids, p_outcomes) AS r(ord, id, outcome)
          JOIN unnest(p_channels) WITH ORDINALITY AS c(channel, ord) ON c.ord = r.ord
         WHERE r.outcome IN ('created', 'updated')
    ), x AS (
        SELECT r.channel AS name, 1::bigint AS size, 0 AS leases FROM r
        UNION ALL
        SELECT o.channel, -1::bigint, -o.leased::integer
          FROM unnest(p_old_ids, p_old_channels, p_old_leased) AS o(id, channel, leased)
          JOIN r ON r.id = o.id AND r.outcome = 'updated'
    )
    SELECT array_agg(x.name), array_agg(x.size), array_agg(x.leases)
      INTO v_names, v_sizes, v_leases
      FROM x WHERE x.name IS NOT NULL;
    IF v_names IS NOT NULL THEN
        PERFORM {schema}._channel_apply(q, v_names, v_sizes, v_leases, p_now);
        -- Per grown channel, a probe by its full key (see _channel_apply_one).
        FOR v_full IN
            SELECT x.name, x.on_full, x.max_size, x.current_size - x.max_size AS excess
              FROM (SELECT t.name FROM unnest(v_names, v_sizes) AS t(name, size)
                     GROUP BY t.name HAVING sum(t.size) > 0) g
             CROSS JOIN LATERAL (
                 SELECT c.name, c.on_full, c.max_size, c.current_size FROM {schema}.channel c
                  WHERE c.queue_id = q.id AND c.name = g.name AND c.current_size > c.max_size
                 OFFSET 0) x
             ORDER BY x.name
        LOOP
            IF v_full.on_full = 'reject' THEN
                RAISE EXCEPTION 'channel % of queue % is full (max_size %)',
                    quote_literal(v_full.name), quote_literal(q.name), v_full.max_size
                    USING ERRCODE = 'LQ007';
            END IF;
            v_drop := v_drop || ARRAY(
                SELECT r.id FROM unnest(p_ords, p_ids, p_outcomes) AS r(ord, id, outcome)
                  JOIN unnest(p_channels) WITH ORDINALITY AS c(channel, ord) ON c.ord = r.ord
                 WHERE r.outcome = 'created' AND c.channel = v_full.name
                 ORDER BY r.ord DESC LIMIT v_full.excess);
        END LOOP;
        IF cardinality(v_drop) > 0 THEN
            WITH d AS (
                DELETE FROM {schema}.message m WHERE m.queue_id = q.id AND m.id = ANY (v_drop)
                RETURNING m.channel
            )
            SELECT array_agg(d.channel) INTO v_gone FROM d;
            PERFORM {schema}._channel_apply(q, v_gone, array_fill(-1::bigint, ARRAY[cardinality(v_gone)]),
                                            array_fill(0, ARRAY[cardinality(v_gone)]), p_now);
        END IF;
    END IF;
    RETURN QUERY
    SELECT r.ord, CASE WHEN r.id = ANY (v_drop) THEN NULL ELSE r.id END,
           CASE WHEN r.id = ANY (v_drop) THEN 'dropped' ELSE r.outcome END
      FROM unnest(p_ords, p_ids, p_outcomes) AS r(ord, id, outcome)
     ORDER BY r.ord;
END $$;

-- Configure a channel: this policy replaces the queue's defaults for it, and the channel is kept
-- while empty. NULL limits are unlimited. Applies from the next delivery: a lower
-- max_concurrency or max_size leaves messages already leased or queued alone. Returns the
-- channel as channel_list does.
CREATE OR REPLACE FUNCTION {schema}.channel_set(
    p_queue               text,
    p_channel             text,
    p_max_concurrency     integer DEFAULT NULL,
    p_release_interval_ms bigint  DEFAULT NULL,
    p_max_size            bigint  DEFAULT NULL,
    p_on_full             text    DEFAULT 'reject',
    p_now                 bigint  DEFAULT NULL
) RETURNS TABLE (
    name text, max_concurrency integer, release_interval_ms bigint, max_size bigint,
    on_full text, explicit boolean, size bigint, leased integer, last_served_at bigint,
    ready_at bigint
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q {schema}.queue := {schema}._queue(p_queue);
BEGIN
    PERFORM {schema}._check_channel(p_channel);
    PERFORM {schema}._check_channel_policy(p_max_concurrency, p_release_interval_ms, p_max_size,
                                           p_on_full);
    INSERT INTO {schema}.channel AS c (queue_id, name, max_concurrency, release_interval_ms,
                                      max_size, on_full, explicit, turn)
    VALUES (q.id, p_channel, p_max_concurrency, p_release_interval_ms, p_max_size, p_on_full,
            true, nextval('{schema}.channel_turn_seq'))
    ON CONFLICT ON CONSTRAINT channel_pkey DO UPDATE
       SET max_concurrency = excluded.max_concurrency,
           release_interval_ms = excluded.release_interval_ms,
           max_size = excluded.max_size, on_full = excluded.on_full, explicit = true;
    PERFORM {schema}._channel_apply(q, ARRAY[p_channel], ARRAY[0::bigint], ARRAY[0],
                                    {schema}._now(p_now));
    RETURN QUERY SELECT * FROM {schema}.channel_list(p_queue, 1, NULL, p_channel);
END $$;

-- Give a configured channel back the queue's default policy; it is deleted once empty (and out
-- of its release interval). Returns false if it was not configured.
CREATE OR REPLACE FUNCTION {schema}.channel_reset(p_queue text, p_channel text, p_now bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q {schema}.queue := {schema}._queue(p_queue);
BEGIN
    PERFORM {schema}._check_channel(p_channel);
    UPDATE {schema}.channel c
       SET explicit = false, max_concurrency = q.channel_max_concurrency,
           release_interval_ms = q.channel_release_interval_ms, max_size = q.channel_max_size,
           on_full = q.channel_on_full
     WHERE c.queue_id = q.id AND c.name = p_channel AND c.explicit;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM {schema}._channel_apply(q, ARRAY[p_channel], ARRAY[0::bigint], ARRAY[0],
                                    {schema}._now(p_now));
    RETURN true;
END $$;

-- The channels of a queue by name, p_limit at a time after p_after (or the one named p_name):
-- policy, size (messages: ready, scheduled and leased), leased (never above max_concurrency),
-- when it was last served and when it may deliver next (NULL: empty). A page starts at p_after
-- (p_name) in the channel key's index, in a generic plan too ('' sorts before every name):
-- "p_after IS NULL OR c.name > p_after" walked a queue's channels from the first (80 ms a page
-- at 100,000 channels).
CREATE OR REPLACE FUNCTION {schema}.channel_list(
    p_queue text, p_limit integer DEFAULT 1000, p_after text DEFAULT NULL, p_name text DEFAULT NULL
) RETURNS TABLE (
    name text, max_concurrency integer, release_interval_ms bigint, max_size bigint,
    on_full text, explicit boolean, size bigint, leased integer, last_served_at bigint,
    ready_at bigint
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q {schema}.queue := {schema}._queue(p_queue);
BEGIN
    PERFORM {schema}._check_limit(p_limit);
    RETURN QUERY
    SELECT c.name, c.max_concurrency, c.release_interval_ms, c.max_size, c.on_full, c.explicit,
           c.current_size, c.current_concurrency, c.last_served_at, c.ready_at
      FROM {schema}.channel c
     WHERE c.queue_id = q.id AND c.name > coalesce(p_after, '') AND c.name >= coalesce(p_name, '')
       AND (p_name IS NULL OR c.name = p_name)
     ORDER BY c.name
     LIMIT p_limit;
END $$;

-- Recount the channels of a queue from its messages and correct counters that differ (say
-- after a crash emptied an UNLOGGED queue). Holds the queue's channel rows while it runs, so
-- the queue's channel writers wait (other queues never do). Returns how many channels were
-- corrected.
CREATE OR REPLACE FUNCTION {schema}.channel_recount(p_queue text, p_now bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q        {schema}.queue := {schema}._queue(p_queue);
    v_names  text[];
    v_sizes  bigint[];
    v_leases integer[];
BEGIN
    -- Every function that changes a channel's messages updates the channel row in the same
    -- transaction: with the rows locked (waiting for such writers to commit), the count below,
    -- a new statement with a new snapshot, sees each writer's messages and counters together
    -- or neither.
    PERFORM FROM {schema}.channel c WHERE c.queue_id = q.id ORDER BY c.name FOR UPDATE;
    WITH actual AS (
        SELECT m.channel AS name, count(*) AS size, count(*) FILTER (WHERE m.leased) AS leases
          FROM {schema}.message m
         WHERE m.queue_id = q.id AND m.channel IS NOT NULL
         GROUP BY m.channel
    ), diff AS (
        SELECT coalesce(a.name, c.name) AS name,
               coalesce(a.size, 0) - coalesce(c.current_size, 0) AS size,
               coalesce(a.leases, 0) - coalesce(c.current_concurrency, 0) AS leases
          FROM actual a
          FULL JOIN (SELECT * FROM {schema}.channel WHERE queue_id = q.id) c ON c.name = a.name
    )
    SELECT array_agg(diff.name), array_agg(diff.size), array_agg(diff.leases::integer)
      INTO v_names, v_sizes, v_leases
      FROM diff WHERE diff.size <> 0 OR diff.leases <> 0;
    IF v_names IS NULL THEN
        RETURN 0::bigint;
    END IF;
    PERFORM {schema}._channel_enable(q.id);
    PERFORM {schema}._channel_apply(q, v_names, v_sizes, v_leases, {schema}._now(p_now));
    RETURN cardinality(v_names)::bigint;
END $$;
