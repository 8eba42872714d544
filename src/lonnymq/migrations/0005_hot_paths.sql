-- LonnyMQ: the calls a consumer makes once per message or batch, made lean and kept on the
-- primary key.
--
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal;
-- literal braces are doubled.
--
-- 1. Settling by (id, token) looks rows up by primary key whatever the statistics say.
--    _ack, nack, extend (0001) and give_up (0004) said "m.deliveries = t.token AND m.leased".
--    The partial index of leased rows (message_leased_idx, WHERE leased) answers "leased rows
--    of this queue" too, and right after a burst of takes the statistics still say there are
--    none: the planner then hash-joined the ids against every leased row of the queue. With
--    150k leased, an ack of 100 took 46 ms instead of 0.25 ms (take(100, ack=) 1.7 s per call).
--    They now say "m.leased IS TRUE": the same rows (leased is NOT NULL), but the planner
--    cannot prove the index predicate from it, so the primary key is the only index left.
--    (test_plans.py: settling reads only its rows, stale statistics.) The functions below are
--    those of 0001/0004 with only that change.
--
-- 2. take(queue, 1, ack => previous) is what a one-at-a-time consumer runs for every message.
--    In 0001 it went through seven nested plpgsql calls (_queue, _now, _check_limit,
--    _check_positive, _ack, _lock_ready, _deliver), each its own statement with a result set
--    passed up. Measured on PostgreSQL 15, one connection: 830-890 us per call, against
--    300-320 us for the bare DELETE ... SKIP LOCKED of a queue without leases. The lean path
--    below runs the checks inline, calls _ack() only when there is something to acknowledge,
--    and locks and leases one message with two statements of its own: 410-455 us. (Inlining
--    _ack()'s DELETE here, or in ack(), measured no difference, so acks stay in _ack().)
--    Batches, channel queues, archiving queues, explicit clocks and messages at their last
--    attempt still take the general path, so the semantics are those of 0001 (the whole test
--    suite runs against this version).
--
-- 3. now_ms() is a public function, so 0002 made it SECURITY DEFINER with a pinned
--    search_path: every call from inside another function paid for switching search_path
--    and could not be inlined. _now() and the lean path read the clock directly instead (the
--    same expression).
--
-- 4. queue_drop() serialises with queue_create() and with other drops of the same name (0001
--    took no lock: a second concurrent drop failed with a raw "table does not exist"), and a
--    queue that became a dead-letter queue while it was being dropped is refused as in use.
--
-- Replacing a function resets SECURITY DEFINER and its pinned search_path: the last statement
-- re-applies them (0002_roles.sql).

-- 1. Settling by primary key ------------------------------------------------------------------

CREATE OR REPLACE FUNCTION {schema}._ack(q {schema}.queue, p_ids bigint[], p_tokens integer[],
                              p_archive boolean, p_now bigint)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_channels text[];
    v_ids      bigint[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        PERFORM {schema}._invalid('ids and tokens must have the same length');
    END IF;
    IF q.uses_channels AND NOT p_archive THEN
        -- As below, and the messages leave their channels.
        WITH d AS (
            DELETE FROM {schema}.message m
             USING unnest(p_ids, p_tokens) AS t(id, token)
             WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token AND m.leased IS TRUE
            RETURNING m.id, m.channel
        )
        SELECT array_agg(d.id), array_agg(d.channel) FILTER (WHERE d.channel IS NOT NULL)
          INTO v_ids, v_channels
          FROM d;
        IF v_channels IS NOT NULL THEN
            PERFORM {schema}._channel_apply(q, v_channels,
                array_fill(-1::bigint, ARRAY[cardinality(v_channels)]),
                array_fill(-1, ARRAY[cardinality(v_channels)]), p_now);
        END IF;
        RETURN QUERY SELECT unnest(v_ids);
        RETURN;
    END IF;
    IF q.uses_channels THEN
        -- Lock the messages first (in id order) to know the channels they leave.
        SELECT array_agg(x.channel) INTO v_channels
          FROM (SELECT m.channel
                  FROM unnest(p_ids, p_tokens) AS t(id, token)
                  JOIN {schema}.message m ON m.queue_id = q.id AND m.id = t.id
                 WHERE m.deliveries = t.token AND m.leased IS TRUE
                 ORDER BY m.id
                   FOR UPDATE OF m) x
         WHERE x.channel IS NOT NULL;
    END IF;
    IF p_archive THEN
        RETURN QUERY
        WITH d AS (
            DELETE FROM {schema}.message m
             USING unnest(p_ids, p_tokens) AS t(id, token)
             WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token AND m.leased IS TRUE
            RETURNING m.*
        ), a AS (
            INSERT INTO {schema}.archive (queue_id, id, status, archived_at, scheduled_at,
                                          enqueued_at, attempts, deliveries, priority, key, channel,
                                          kind, content_type, headers, state, last_error, payload)
            SELECT d.queue_id, d.id, 'acked', p_now, d.scheduled_at, d.enqueued_at, d.attempts,
                   d.deliveries, d.priority, d.key, d.channel, d.kind, d.content_type, d.headers,
                   d.state, d.last_error, d.payload
              FROM d
            RETURNING id
        )
        SELECT a.id FROM a;
    ELSE
        RETURN QUERY
        DELETE FROM {schema}.message m
         USING unnest(p_ids, p_tokens) AS t(id, token)
         WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token AND m.leased IS TRUE
        RETURNING m.id;
    END IF;
    IF v_channels IS NOT NULL THEN
        PERFORM {schema}._channel_apply(q, v_channels,
            array_fill(-1::bigint, ARRAY[cardinality(v_channels)]),
            array_fill(-1, ARRAY[cardinality(v_channels)]), p_now);
    END IF;
END $$;

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
LANGUAGE plpgsql AS $$
DECLARE
    q      {schema}.queue := {schema}._queue(p_queue);
    v_now  bigint := {schema}._now(p_now);
    v_dead bigint[];
    v_errs text[];
    v_channels text[];
    v_blocked  bigint[];
    v_fifo     bigint[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        PERFORM {schema}._invalid('ids and tokens must have the same length');
    END IF;
    IF EXISTS (SELECT FROM unnest(p_delays_ms) d WHERE d < 0) THEN
        PERFORM {schema}._invalid('delay must be >= 0');
    END IF;
    -- Lock the matching rows once, in id order, so concurrent settlers cannot deadlock.
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.error ORDER BY x.id)
      INTO v_dead, v_errs
      FROM (SELECT t.id, t.error
              FROM unnest(p_ids, p_tokens, p_errors) AS t(id, token, error)
              JOIN {schema}.message m ON m.queue_id = q.id AND m.id = t.id
             WHERE m.deliveries = t.token AND m.leased IS TRUE AND p_count_attempt
               AND m.attempts >= q.max_attempts
             ORDER BY t.id
               FOR UPDATE OF m) x;
    IF v_dead IS NOT NULL THEN
        PERFORM {schema}._dead_letter(q, v_dead, v_errs, v_now);
        RETURN QUERY SELECT d, 'dead'::text FROM unnest(v_dead) d;
    END IF;
    IF q.uses_channels THEN
        -- The retried messages give their leases back (locked first, in id order). In a
        -- strict-FIFO channel (max_concurrency = 1) a retried message keeps its place at the
        -- head and its delay holds the whole channel, so later messages cannot overtake it.
        SELECT array_agg(x.channel), array_agg(CASE WHEN x.fifo THEN v_now + coalesce(x.delay_ms, 0) END),
               array_agg(x.id) FILTER (WHERE x.fifo)
          INTO v_channels, v_blocked, v_fifo
          FROM (SELECT m.id, m.channel, t.delay_ms, c.max_concurrency = 1 AS fifo
                  FROM unnest(p_ids, p_tokens, p_delays_ms) AS t(id, token, delay_ms)
                  JOIN {schema}.message m ON m.queue_id = q.id AND m.id = t.id
                  LEFT JOIN {schema}.channel c ON c.queue_id = q.id AND c.name = m.channel
                 WHERE m.deliveries = t.token AND m.leased IS TRUE AND m.channel IS NOT NULL
                 ORDER BY m.id
                   FOR UPDATE OF m) x;
    END IF;
    RETURN QUERY
    UPDATE {schema}.message m
       SET dequeue_at = CASE WHEN m.id = ANY (v_fifo)
                             THEN m.scheduled_at - m.priority * q.priority_step_ms
                             ELSE {schema}._dequeue_at(v_now + coalesce(t.delay_ms, 0), m.priority, q.priority_step_ms, v_now)
                        END,
           leased = false,
           attempts = CASE WHEN p_count_attempt THEN m.attempts ELSE m.attempts - 1 END,
           last_error = coalesce(t.error, m.last_error),
           state = coalesce(t.state, m.state)
      FROM unnest(p_ids, p_tokens, p_delays_ms, p_errors, p_states)
           AS t(id, token, delay_ms, error, state)
     WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token AND m.leased IS TRUE
    RETURNING m.id, 'retry'::text;
    IF v_channels IS NOT NULL THEN
        PERFORM {schema}._channel_apply(q, v_channels,
            array_fill(0::bigint, ARRAY[cardinality(v_channels)]),
            array_fill(-1, ARRAY[cardinality(v_channels)]), v_now, v_blocked);
    END IF;
    PERFORM pg_notify({schema_name}, q.name);
END $$;

CREATE OR REPLACE FUNCTION {schema}.extend(
    p_queue    text,
    p_ids      bigint[],
    p_tokens   integer[],
    p_lease_ms bigint DEFAULT NULL,
    p_now      bigint DEFAULT NULL
) RETURNS TABLE (id bigint, lease_until bigint)
LANGUAGE plpgsql AS $$
DECLARE
    q       {schema}.queue := {schema}._queue(p_queue);
    v_lease bigint := coalesce(p_lease_ms, q.lease_ms);
BEGIN
    PERFORM {schema}._check_positive(p_lease_ms, 'lease_ms');
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        PERFORM {schema}._invalid('ids and tokens must have the same length');
    END IF;
    RETURN QUERY
    UPDATE {schema}.message m
       SET dequeue_at = {schema}._now(p_now) + v_lease
      FROM unnest(p_ids, p_tokens) AS t(id, token)
     WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token AND m.leased IS TRUE
    RETURNING m.id, m.dequeue_at;
END $$;

CREATE OR REPLACE FUNCTION {schema}.give_up(
    p_queue  text,
    p_ids    bigint[],
    p_tokens integer[],
    p_errors text[]  DEFAULT NULL,
    p_now    bigint  DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    q      {schema}.queue := {schema}._queue(p_queue);
    v_now  bigint := {schema}._now(p_now);
    v_ids  bigint[];
    v_errs text[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        PERFORM {schema}._invalid('ids and tokens must have the same length');
    END IF;
    -- Lock in id order, like nack, so concurrent settlers cannot deadlock.
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.error ORDER BY x.id)
      INTO v_ids, v_errs
      FROM (SELECT t.id, t.error
              FROM unnest(p_ids, p_tokens, p_errors) AS t(id, token, error)
              JOIN {schema}.message m ON m.queue_id = q.id AND m.id = t.id
             WHERE m.deliveries = t.token AND m.leased IS TRUE
             ORDER BY t.id
               FOR UPDATE OF m) x;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM {schema}._dead_letter(q, v_ids, v_errs, v_now);
    RETURN QUERY SELECT unnest(v_ids);
END $$;

-- 2, 3. The lean path -----------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION {schema}._now(p_now bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_clock bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
BEGIN
    IF p_now IS NULL THEN
        RETURN v_clock;
    ELSIF p_now <= v_clock + 1000 OR pg_catalog.pg_has_role(session_user,
            (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = {schema_name}), 'MEMBER') THEN
        RETURN p_now;
    END IF;
    RAISE EXCEPTION 'p_now may not be in the future except for the schema owner (it exists for tests)'
        USING ERRCODE = 'LQ002';
END $$;

CREATE OR REPLACE FUNCTION {schema}.take(
    p_queue      text,
    p_limit      integer DEFAULT 1,
    p_lease_ms   bigint  DEFAULT NULL,
    p_ack_ids    bigint[] DEFAULT NULL,
    p_ack_tokens integer[] DEFAULT NULL,
    p_now        bigint  DEFAULT NULL
) RETURNS SETOF {schema}.delivery
LANGUAGE plpgsql AS $$
DECLARE
    q       {schema}.queue;
    v_now   bigint;
    v_lease bigint;
    v_want  integer := p_limit;
    v_round integer := 0;
    v_id    bigint;
    v_tries integer;
    v_ids   bigint[];
    v_dead  bigint[];
BEGIN
    -- The checks of 0001, called only when they are going to fail (each call is a statement).
    SELECT * INTO q FROM {schema}.queue WHERE name = p_queue;
    IF NOT FOUND THEN
        q := {schema}._queue(p_queue);
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        PERFORM {schema}._check_limit(p_limit);
    END IF;
    IF p_lease_ms <= 0 THEN
        PERFORM {schema}._check_positive(p_lease_ms, 'lease_ms');
    END IF;
    IF p_now IS NULL THEN
        v_now := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    ELSE
        v_now := {schema}._now(p_now);
    END IF;
    v_lease := coalesce(p_lease_ms, q.lease_ms);

    IF p_ack_ids IS NOT NULL THEN
        PERFORM {schema}._ack(q, p_ack_ids, p_ack_tokens, q.archive, v_now);
    END IF;

    IF q.uses_channels THEN
        RETURN QUERY SELECT * FROM {schema}._take_channels(q, p_limit, v_lease, v_now, 'lease');
        RETURN;
    END IF;

    -- One message: _lock_ready's candidate query for one row, and _deliver's lease of it.
    IF p_limit = 1 THEN
        SELECT m.id, m.attempts INTO v_id, v_tries
          FROM {schema}.message m
         WHERE m.queue_id = q.id AND m.channel IS NULL AND m.dequeue_at <= v_now
         ORDER BY m.dequeue_at, m.id
         LIMIT 1
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF v_tries < q.max_attempts THEN
            RETURN QUERY
            UPDATE {schema}.message m
               SET dequeue_at = v_now + v_lease, attempts = m.attempts + 1,
                   deliveries = m.deliveries + 1, leased = true
             WHERE m.queue_id = q.id AND m.id = v_id
            RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                      m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state,
                      m.last_error, m.payload;
            RETURN;
        END IF;
        -- Its lease expired on the last attempt: the general path below (which sees the row we
        -- hold) dead-letters it and looks further.
    END IF;

    -- The general path of 0001: messages found dead do not count against p_limit.
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

-- 4. Dropping a queue --------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION {schema}.queue_drop(p_name text, p_if_exists boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queue;
BEGIN
    -- queue_create's lock, then the row: a concurrent drop waits here and then finds nothing.
    PERFORM pg_advisory_xact_lock(hashtext({schema_name}), hashtext(p_name));
    SELECT * INTO q FROM {schema}.queue WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        IF p_if_exists THEN
            RETURN false;
        END IF;
        PERFORM {schema}._queue(p_name);
    END IF;
    IF EXISTS (SELECT FROM {schema}.queue WHERE dead_letter_queue_id = q.id) THEN
        RAISE EXCEPTION 'queue % is the dead-letter queue of %', quote_literal(p_name),
            (SELECT string_agg(quote_literal(name), ', ') FROM {schema}.queue
              WHERE dead_letter_queue_id = q.id)
            USING ERRCODE = 'LQ006';
    END IF;
    EXECUTE format('DROP TABLE %I.%I', {schema_name}, 'message_' || q.id);
    DELETE FROM {schema}.archive WHERE queue_id = q.id;
    BEGIN
        DELETE FROM {schema}.queue WHERE id = q.id;
    EXCEPTION WHEN foreign_key_violation THEN
        -- A queue naming this one as its dead-letter queue committed since the check above.
        RAISE EXCEPTION 'queue % became the dead-letter queue of another queue', quote_literal(p_name)
            USING ERRCODE = 'LQ006';
    END;
    RETURN true;
END $$;

SELECT {schema}._apply_privileges();
