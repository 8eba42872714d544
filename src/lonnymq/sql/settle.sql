-- LonnyMQ settling: what a consumer does with a delivery: ack, nack (retry, defer, release),
-- extend its lease, or give up on it (dead-letter now).
--
-- Settling finds each row by its primary key, never by a join of the given ids with the message
-- table: a join is planned from the table's statistics, and those can be far off. Right after a
-- burst of takes they say no row is leased, and a join used the partial index of leased rows
-- (46 ms instead of 0.25 ms for an ack of 100 with 150k leased); taken while a snapshot is held
-- (ANALYZE then counts only live rows) they make every join read all the entries the queue
-- left in the primary key (4,000 for an ack of 5 after 2,000 messages). So a settle first locks
-- its rows, in id order, with a LATERAL probe per (id, token), which can only be a lookup by
-- key (LIMIT 1: a key has one row in a snapshot, and the scan then ends at it instead of
-- reading on to the next key), and then changes them by ctid (which stays put while this
-- transaction holds the row; a second statement, so it sees a version another transaction
-- committed while we waited for the lock). One delivery needs neither (ack's and take's
-- one-statement ack): its DELETE names the row by its key, a waited-for row's new version is
-- checked again by the same filters (PostgreSQL re-evaluates them), and one row has no lock
-- order to keep. A drain's batch
-- (take(n, ack=previous) of an ordinary queue, take.sql) locks nothing first either: a probe by
-- key per pair in id order, each row deleted by its ctid in that order in the same statement;
-- a row another transaction changed while it waited is left (the TID scan's recheck refuses the
-- new version) and goes, with repeats and stale tokens, to _ack below.
-- The probes say "m.leased IS TRUE", not "m.leased" (the same rows: leased is NOT
-- NULL), so the planner cannot use the partial index of leased rows; the changes by ctid say
-- "(m.queue_id = q.id) IS TRUE", so it cannot scan the queue's part of the primary key instead
-- of fetching the rows by ctid (it checks that a ctid found in both partitions is the queue's).
-- test_plans.py tests all of them.
--
-- The entry points (ack, nack, extend, give_up here; take and take_tx in take.sql) run with
-- plan_cache_mode = force_generic_plan: PL/pgSQL otherwise re-plans, on every call, each
-- statement whose generic plan it prices above a custom one, which for an array parameter (the
-- generic plan assumes 10 elements, a custom plan sees the 1 of a single ack) is always the case:
-- measured on PostgreSQL 15 per call, ack 757 -> 600 us, nack 1,120 -> 683 us, extend 668 -> 565
-- us, take(1) 656 -> 590 us. The generic plans are the ones the plan tests check. A session
-- keeps its generic plan, made at its first call: one made while the table was empty (a consumer
-- started before the producers; statistics not yet taken) scanned the whole message table on
-- every call for as long as the session lived (held-snapshot run: a take went from 8 ms to 4 s).
-- So they also run with enable_seqscan = off (every statement here has an index for its rows),
-- and jit = off, which the cost of a sequence's or an empty partition's unavoidable scan would
-- otherwise trigger.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Acknowledge the deliveries (p_ids[i], p_tokens[i]) of queue q whose token still matches a
-- leased message: delete them (remembering (id, token) in settled, for ack's repeats), or move
-- them to the archive as 'acked' when p_archive (the archive row is the memory). Returns the ids
-- acknowledged. Raises LQ002 if the arrays differ in length. Writes message, settled, archive,
-- channel, queue_stat (acked; one appended row, stats.sql). Locks: the message rows in id order,
-- then their channels.
CREATE OR REPLACE FUNCTION {schema}._ack(q {schema}.queue, p_ids bigint[], p_tokens integer[],
                              p_archive boolean, p_now bigint)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_tids     tid[];
    v_ids      bigint[];
    v_channels text[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        PERFORM {schema}._invalid('ids and tokens must have the same length');
    END IF;
    -- Lock the matching rows in id order (see the header: by key, then by ctid).
    SELECT array_agg(k.tid) INTO v_tids
      FROM (SELECT t.id, t.token FROM unnest(p_ids, p_tokens) AS t(id, token) ORDER BY t.id) t
     CROSS JOIN LATERAL (SELECT m.ctid AS tid FROM {schema}.message m
                          WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token
                            AND m.leased IS TRUE
                          LIMIT 1 FOR UPDATE) k;
    IF v_tids IS NULL THEN
        RETURN;
    END IF;
    IF p_archive THEN
        WITH d AS (
            DELETE FROM {schema}.message m
             WHERE m.ctid = ANY (v_tids) AND (m.queue_id = q.id) IS TRUE
            RETURNING m.*
        ), a AS (
            INSERT INTO {schema}.archive (queue_id, id, status, archived_at, scheduled_at,
                                          enqueued_at, attempts, deliveries, priority, key, channel,
                                          kind, content_type, headers, state, last_error, payload)
            SELECT d.queue_id, d.id, 'acked', p_now, d.scheduled_at, d.enqueued_at, d.attempts,
                   d.deliveries, d.priority, d.key, d.channel, d.kind, d.content_type, d.headers,
                   d.state, d.last_error, d.payload
              FROM d
        ), st AS (
            INSERT INTO {schema}.queue_stat (queue_id, minute, acked)
            SELECT q.id, p_now / 60000, count(*) FROM d HAVING count(*) > 0
        )
        SELECT array_agg(d.id), array_agg(d.channel) FILTER (WHERE d.channel IS NOT NULL)
          INTO v_ids, v_channels
          FROM d;
    ELSE
        WITH d AS (
            DELETE FROM {schema}.message m
             WHERE m.ctid = ANY (v_tids) AND (m.queue_id = q.id) IS TRUE
            RETURNING m.id, m.deliveries, m.channel
        ), s AS (
            INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
            SELECT q.id, d.id, d.deliveries, 'acked', p_now FROM d
        ), st AS (
            INSERT INTO {schema}.queue_stat (queue_id, minute, acked)
            SELECT q.id, p_now / 60000, count(*) FROM d HAVING count(*) > 0
        )
        SELECT array_agg(d.id), array_agg(d.channel) FILTER (WHERE d.channel IS NOT NULL)
          INTO v_ids, v_channels
          FROM d;
    END IF;
    -- The messages leave their channels (locked after the messages, in name order).
    IF v_channels IS NOT NULL THEN
        PERFORM {schema}._channel_apply(q, v_channels,
            array_fill(-1::bigint, ARRAY[cardinality(v_channels)]),
            array_fill(-1, ARRAY[cardinality(v_channels)]), p_now);
    END IF;
    RETURN QUERY SELECT unnest(v_ids);
END $$;

-- Acknowledge deliveries: each (id, token) pair whose token still matches is deleted (or
-- archived). Idempotent: a pair that this very delivery already acknowledged (within the last
-- hour, see settled; or while its archive row is kept) is returned again and changes nothing.
-- Returns the ids acknowledged; a stale token (the message was delivered again, updated,
-- cancelled, given back or dead-lettered) changes nothing and is not returned. Concurrent acks
-- of one delivery: one deletes, the others wait for its row lock and then find its memory (each
-- statement of this VOLATILE function reads a fresh snapshot). Writes and locks as _ack.
CREATE OR REPLACE FUNCTION {schema}.ack(
    p_queue   text,
    p_ids     bigint[],
    p_tokens  integer[],
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    q      {schema}.queue;
    v_done bigint[];
BEGIN
    -- The common ack, one delivery of a queue without channels and without archiving: one
    -- statement (each statement of a call costs a snapshot and an executor start; ack used to
    -- run four). The row is found by its primary key, with the token and "leased IS TRUE" as
    -- filters (see the header); a row another transaction holds is waited for, and its new
    -- version checked again by the same filters (one row: no lock order to keep). Anything else
    -- (an unknown queue, a repeat, a stale token, channels, archiving, several deliveries) takes
    -- the general path below, which raises or answers as before.
    IF cardinality(p_ids) = 1 AND cardinality(p_tokens) = 1 THEN
        RETURN QUERY
            WITH x AS (
                SELECT y.id,
                       CASE WHEN p_now IS NULL THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                            ELSE {schema}._now(p_now) END AS now_ms
                  FROM {schema}.queue y
                 WHERE y.name = p_queue AND NOT y.uses_channels AND NOT coalesce(p_archive, y.archive)
            ), d AS (
                DELETE FROM {schema}.message m
                 USING x
                 WHERE m.queue_id = x.id AND m.id = p_ids[1] AND m.deliveries = p_tokens[1]
                   AND m.leased IS TRUE
                RETURNING m.queue_id, m.id, m.deliveries, x.now_ms
            ), k AS (
                INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
                SELECT d.queue_id, d.id, d.deliveries, 'acked', d.now_ms FROM d
            ), st AS (
                INSERT INTO {schema}.queue_stat (queue_id, minute, acked)
                SELECT d.queue_id, d.now_ms / 60000, 1 FROM d
            )
            SELECT d.id FROM d;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    q := {schema}._queue(p_queue);
    v_done := ARRAY(SELECT a FROM {schema}._ack(q, p_ids, p_tokens, coalesce(p_archive, q.archive),
                                                {schema}._now(p_now)) a);
    IF cardinality(v_done) < cardinality(p_ids) THEN
        -- Repeats: acknowledged earlier by the same delivery (deleted, or archived as acked).
        v_done := v_done || ARRAY(
            SELECT DISTINCT t.id FROM unnest(p_ids, p_tokens) AS t(id, token)
             WHERE t.id <> ALL (v_done)
               AND (EXISTS (SELECT FROM {schema}.settled s
                             WHERE s.queue_id = q.id AND s.id = t.id AND s.token = t.token
                               AND s.outcome = 'acked')
                    OR EXISTS (SELECT FROM {schema}.archive a
                                WHERE a.queue_id = q.id AND a.id = t.id AND a.deliveries = t.token
                                  AND a.status = 'acked')));
    END IF;
    RETURN QUERY SELECT unnest(v_done);
END $$;

-- Remove the superseded versions p_ids of queue q (a replace while they were leased made a new
-- version of their message, see send_batch): deleted, never retried, dead-lettered or
-- archived, and out of their channels (a message and its lease less). Called by nack for their
-- holders and by take when their lease expired, with the rows locked. Returns nothing. Writes
-- message, channel. Locks: their channels (the message rows are the caller's).
CREATE OR REPLACE FUNCTION {schema}._drop_superseded(q {schema}.queue, p_ids bigint[], p_now bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_channels text[];
    v_leases   integer[];
BEGIN
    WITH d AS (
        DELETE FROM {schema}.message m
         WHERE m.queue_id = q.id AND m.id = ANY (p_ids) AND m.superseded_by IS NOT NULL
        RETURNING m.channel, m.leased
    )
    SELECT array_agg(d.channel), array_agg(-d.leased::integer) INTO v_channels, v_leases
      FROM d WHERE d.channel IS NOT NULL;
    IF v_channels IS NOT NULL THEN
        PERFORM {schema}._channel_apply(q, v_channels,
            array_fill(-1::bigint, ARRAY[cardinality(v_channels)]), v_leases, p_now);
    END IF;
END $$;

-- Give deliveries back: each matching (id, token) becomes ready again after its delay (priority
-- kept), with its error and saved state. A delivery of a superseded version (a replace came
-- while it was leased) is not retried: the row is deleted (its new version is another message,
-- waiting at its own schedule with attempts reset) and the pair is returned as 'retry'. p_count_attempt = false (defer/release) does not
-- count toward max_attempts; otherwise a message on its last attempt is dead-lettered.
-- Returns (id, outcome) with outcome 'retry' or 'dead'; stale tokens are not returned.
-- Idempotent: a pair whose delivery already gave the message back (it is waiting, unleased,
-- with the same token) is returned again as 'retry', one it already dead-lettered as 'dead'
-- (settled; or deleted as superseded: 'retry'), and nothing changes.
-- Writes message, settled, channel (and the dead-letter queue's, archive), queue_stat (nacked:
-- the retries that count an attempt). Locks: the message rows in id order, then their
-- channels. Notifies channel {schema_name} with the queue name.
CREATE OR REPLACE FUNCTION {schema}.nack(
    p_queue         text,
    p_ids           bigint[],
    p_tokens        integer[],
    p_delays_ms     bigint[]  DEFAULT NULL,
    p_errors        text[]    DEFAULT NULL,
    p_states        jsonb[]   DEFAULT NULL,
    p_count_attempt boolean   DEFAULT true,
    p_now           bigint    DEFAULT NULL
) RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    q      {schema}.queue := {schema}._queue(p_queue);
    v_now  bigint := {schema}._now(p_now);
    v_dead bigint[];
    v_errs text[];
    v_toks integer[];
    v_retry    bigint[];
    v_tids     tid[];     -- the retried messages, with their delays, errors and states
    v_delays   bigint[];
    v_rerrs    text[];
    v_rstates  jsonb[];
    v_channels text[];    -- the channels of the retried messages that have one
    v_ctids    tid[];
    v_cdelays  bigint[];
    v_blocked  bigint[];
    v_fifo     tid[];
    v_gone     bigint[];
    v_gtoks    integer[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        PERFORM {schema}._invalid('ids and tokens must have the same length');
    END IF;
    IF EXISTS (SELECT FROM unnest(p_delays_ms) d WHERE d < 0) THEN
        PERFORM {schema}._invalid('delay must be >= 0');
    END IF;
    -- Lock the matching rows once, in id order, so concurrent settlers cannot deadlock (see
    -- the header: by key, then by ctid), and sort them: superseded versions, the last attempt
    -- (dead), the rest (retried).
    SELECT array_agg(x.id) FILTER (WHERE x.gone), array_agg(x.token) FILTER (WHERE x.gone),
           array_agg(x.id) FILTER (WHERE x.dead), array_agg(x.error) FILTER (WHERE x.dead),
           array_agg(x.token) FILTER (WHERE x.dead),
           array_agg(x.tid) FILTER (WHERE x.retry), array_agg(x.delay_ms) FILTER (WHERE x.retry),
           array_agg(x.error) FILTER (WHERE x.retry), array_agg(x.state) FILTER (WHERE x.retry),
           array_agg(x.channel) FILTER (WHERE x.retry AND x.channel IS NOT NULL),
           array_agg(x.tid) FILTER (WHERE x.retry AND x.channel IS NOT NULL),
           array_agg(x.delay_ms) FILTER (WHERE x.retry AND x.channel IS NOT NULL)
      INTO v_gone, v_gtoks, v_dead, v_errs, v_toks, v_tids, v_delays, v_rerrs, v_rstates,
           v_channels, v_ctids, v_cdelays
      FROM (SELECT t.id, t.token, t.delay_ms, t.error, t.state, k.tid, k.channel, k.gone,
                   NOT k.gone AND p_count_attempt AND k.attempts >= q.max_attempts AS dead,
                   NOT k.gone AND NOT (p_count_attempt AND k.attempts >= q.max_attempts) AS retry
              FROM (SELECT t.* FROM unnest(p_ids, p_tokens, p_delays_ms, p_errors, p_states)
                                    AS t(id, token, delay_ms, error, state)
                     ORDER BY t.id) t
             CROSS JOIN LATERAL (SELECT m.ctid AS tid, m.channel, m.attempts,
                                        m.superseded_by IS NOT NULL AS gone
                                   FROM {schema}.message m
                                  WHERE m.queue_id = q.id AND m.id = t.id
                                    AND m.deliveries = t.token AND m.leased IS TRUE
                                  LIMIT 1 FOR UPDATE) k) x;
    -- Superseded versions: deleted, remembered for repeats.
    IF v_gone IS NOT NULL THEN
        PERFORM {schema}._drop_superseded(q, v_gone, v_now);
        INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
        SELECT q.id, g.id, min(g.token), 'superseded', v_now FROM unnest(v_gone, v_gtoks) AS g(id, token)
         GROUP BY g.id;
        RETURN QUERY SELECT DISTINCT g, 'retry'::text FROM unnest(v_gone) g;
    END IF;
    IF v_dead IS NOT NULL THEN
        PERFORM {schema}._dead_letter(q, v_dead, v_errs, v_now);
        INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
        SELECT q.id, d.id, min(d.token), 'dead', v_now FROM unnest(v_dead, v_toks) AS d(id, token)
         GROUP BY d.id;
        RETURN QUERY SELECT d, 'dead'::text FROM unnest(v_dead) d;
    END IF;
    IF v_channels IS NOT NULL THEN
        -- The retried messages give their leases back. In a strict-FIFO channel
        -- (max_concurrency = 1) a retried message keeps its place at the head and its delay
        -- holds the whole channel, so later messages cannot overtake it.
        SELECT array_agg(CASE WHEN f.fifo THEN v_now + coalesce(f.delay_ms, 0) END ORDER BY f.ord),
               array_agg(f.tid) FILTER (WHERE f.fifo)
          INTO v_blocked, v_fifo
          FROM (SELECT r.ord, r.tid, r.delay_ms,
                       coalesce((SELECT c.max_concurrency = 1 FROM {schema}.channel c
                                  WHERE c.queue_id = q.id AND c.name = r.channel), false) AS fifo
                  FROM unnest(v_channels, v_ctids, v_cdelays) WITH ORDINALITY AS r(channel, tid, delay_ms, ord)) f;
    END IF;
    IF v_tids IS NOT NULL THEN
        WITH u AS (
            UPDATE {schema}.message m
               SET dequeue_at = CASE WHEN m.ctid = ANY (v_fifo)
                                     THEN m.scheduled_at - m.priority * q.priority_step_ms
                                     ELSE {schema}._dequeue_at(v_now + coalesce(t.delay_ms, 0), m.priority,
                                                               q.priority_step_ms, v_now)
                                END,
                   leased = false,
                   attempts = CASE WHEN p_count_attempt THEN m.attempts ELSE m.attempts - 1 END,
                   last_error = coalesce(t.error, m.last_error),
                   state = coalesce(t.state, m.state)
              FROM unnest(v_tids, v_delays, v_rerrs, v_rstates) AS t(tid, delay_ms, error, state)
             WHERE m.ctid = t.tid AND (m.queue_id = q.id) IS TRUE
            RETURNING m.id
        ), st AS (
            INSERT INTO {schema}.queue_stat (queue_id, minute, nacked)
            SELECT q.id, v_now / 60000, count(*) FROM u HAVING count(*) > 0 AND p_count_attempt
        )
        SELECT array_agg(u.id) INTO v_retry FROM u;
        RETURN QUERY SELECT r, 'retry'::text FROM unnest(v_retry) r;
    END IF;
    IF v_channels IS NOT NULL THEN
        PERFORM {schema}._channel_apply(q, v_channels,
            array_fill(0::bigint, ARRAY[cardinality(v_channels)]),
            array_fill(-1, ARRAY[cardinality(v_channels)]), v_now, v_blocked);
    END IF;
    IF coalesce(cardinality(v_dead), 0) + coalesce(cardinality(v_retry), 0)
       + coalesce(cardinality(v_gone), 0) < cardinality(p_ids) THEN
        -- Repeats by the delivery that already settled the message (a fresh snapshot: a
        -- concurrent nack of the same delivery that held the row has committed by now).
        RETURN QUERY
        SELECT DISTINCT t.id, CASE WHEN s.outcome = 'dead' THEN 'dead' ELSE 'retry' END
          FROM unnest(p_ids, p_tokens) AS t(id, token)
          LEFT JOIN {schema}.settled s
                 ON s.queue_id = q.id AND s.id = t.id AND s.token = t.token
                AND s.outcome IN ('dead', 'superseded')
          LEFT JOIN {schema}.message m
                 ON m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token
                AND m.leased IS FALSE AND t.token > 0
         WHERE t.id <> ALL (coalesce(v_dead, ARRAY[]::bigint[]) || coalesce(v_retry, ARRAY[]::bigint[])
                            || coalesce(v_gone, ARRAY[]::bigint[]))
           AND (s.id IS NOT NULL OR m.id IS NOT NULL);
    END IF;
    PERFORM {schema}._wake(q.id, q.name);
END $$;

-- Heartbeat: push the lease of each matching (id, token) to now + p_lease_ms.
-- Returns (id, lease_until) for the leases extended; stale tokens are not returned.
-- Writes message (the matching rows).
CREATE OR REPLACE FUNCTION {schema}.extend(
    p_queue    text,
    p_ids      bigint[],
    p_tokens   integer[],
    p_lease_ms bigint DEFAULT NULL,
    p_now      bigint DEFAULT NULL
) RETURNS TABLE (id bigint, lease_until bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    q       {schema}.queue := {schema}._queue(p_queue);
    v_lease bigint := coalesce(p_lease_ms, q.lease_ms);
    v_tids  tid[];
BEGIN
    PERFORM {schema}._check_positive(p_lease_ms, 'lease_ms');
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        PERFORM {schema}._invalid('ids and tokens must have the same length');
    END IF;
    -- Lock the matching rows in id order (see the header: by key, then by ctid).
    v_tids := ARRAY(
        SELECT k.tid
          FROM (SELECT t.id, t.token FROM unnest(p_ids, p_tokens) AS t(id, token) ORDER BY t.id) t
         CROSS JOIN LATERAL (SELECT m.ctid AS tid FROM {schema}.message m
                              WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token
                                AND m.leased IS TRUE
                              LIMIT 1 FOR UPDATE) k);
    RETURN QUERY
    UPDATE {schema}.message m
       SET dequeue_at = {schema}._now(p_now) + v_lease
     WHERE m.ctid = ANY (v_tids) AND (m.queue_id = q.id) IS TRUE
    RETURNING m.id, m.dequeue_at;
END $$;

-- Dead-letter deliveries now, whatever attempts they have left (a handler's own lower attempt
-- limit, or an error that retrying cannot fix). Each (id, token) pair whose token still matches
-- a leased message goes to the dead-letter queue or the archive with its error, exactly like a
-- message that used up max_attempts. Returns the ids dead-lettered; stale tokens are skipped.
-- Idempotent like nack: a pair this delivery already dead-lettered (settled) is returned again.
-- Writes settled, then as _dead_letter. Locks the message rows in id order, like nack; then as
-- _dead_letter.
CREATE OR REPLACE FUNCTION {schema}.give_up(
    p_queue  text,
    p_ids    bigint[],
    p_tokens integer[],
    p_errors text[]  DEFAULT NULL,
    p_now    bigint  DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    q      {schema}.queue := {schema}._queue(p_queue);
    v_now  bigint := {schema}._now(p_now);
    v_ids  bigint[];
    v_errs text[];
    v_toks integer[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        PERFORM {schema}._invalid('ids and tokens must have the same length');
    END IF;
    -- Lock in id order, like nack, so concurrent settlers cannot deadlock.
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.error ORDER BY x.id),
           array_agg(x.token ORDER BY x.id)
      INTO v_ids, v_errs, v_toks
      FROM (SELECT t.id, t.error, t.token
              FROM (SELECT t.* FROM unnest(p_ids, p_tokens, p_errors) AS t(id, token, error)
                     ORDER BY t.id) t
             CROSS JOIN LATERAL (SELECT FROM {schema}.message m
                                  WHERE m.queue_id = q.id AND m.id = t.id
                                    AND m.deliveries = t.token AND m.leased IS TRUE
                                  LIMIT 1 FOR UPDATE) k) x;
    IF v_ids IS NOT NULL THEN
        PERFORM {schema}._dead_letter(q, v_ids, v_errs, v_now);
        INSERT INTO {schema}.settled (queue_id, id, token, outcome, settled_at)
        SELECT q.id, d.id, min(d.token), 'dead', v_now FROM unnest(v_ids, v_toks) AS d(id, token)
         GROUP BY d.id;
    END IF;
    v_ids := coalesce(v_ids, ARRAY[]::bigint[]);
    IF cardinality(v_ids) < cardinality(p_ids) THEN
        v_ids := v_ids || ARRAY(
            SELECT DISTINCT t.id FROM unnest(p_ids, p_tokens) AS t(id, token)
              JOIN {schema}.settled s
                ON s.queue_id = q.id AND s.id = t.id AND s.token = t.token AND s.outcome = 'dead'
             WHERE t.id <> ALL (v_ids));
    END IF;
    RETURN QUERY SELECT unnest(v_ids);
END $$;
