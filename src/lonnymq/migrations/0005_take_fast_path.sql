-- LonnyMQ: a lean path for the calls a consumer makes once per message.
--
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal;
-- literal braces are doubled.
--
-- take(queue, 1, ack => previous) is what a one-at-a-time consumer runs for every message. In
-- 0001 it went through six nested plpgsql calls (_queue, _now, _check_limit, _check_positive,
-- _ack, _lock_ready, _deliver), each its own statement with a result set passed up. Measured
-- on PostgreSQL 15, one connection: 830-890 us per call, against 300-320 us for the bare
-- DELETE ... SKIP LOCKED of a queue without leases. The lean path below does the same work in
-- four statements (queue row, ack, lock, lease): 410-455 us. Batches, channel queues, archiving
-- queues, explicit clocks and messages at their last attempt still take the general path, so
-- the semantics are those of 0001 (the test suite runs against this version).
--
-- now_ms() is a public function, so 0002 made it SECURITY DEFINER with a pinned search_path:
-- every call from inside another function paid for switching search_path and could not be
-- inlined. _now() and the lean path read the clock directly instead (same expression).
--
-- Replacing a function resets SECURITY DEFINER and its pinned search_path: the last statement
-- re-applies them (0002_roles.sql).

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
        IF q.uses_channels OR q.archive
           OR cardinality(p_ack_ids) IS DISTINCT FROM cardinality(p_ack_tokens) THEN
            PERFORM {schema}._ack(q, p_ack_ids, p_ack_tokens, q.archive, v_now);
        ELSE
            -- _ack() of a plain queue that does not archive: the same statement.
            DELETE FROM {schema}.message m
             USING unnest(p_ack_ids, p_ack_tokens) AS t(id, token)
             WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token AND m.leased;
        END IF;
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

-- ack(): the same for a consumer that acknowledges on its own round trip.
CREATE OR REPLACE FUNCTION {schema}.ack(
    p_queue   text,
    p_ids     bigint[],
    p_tokens  integer[],
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    q {schema}.queue;
BEGIN
    SELECT * INTO q FROM {schema}.queue WHERE name = p_queue;
    IF NOT FOUND THEN
        q := {schema}._queue(p_queue);
    END IF;
    IF q.uses_channels OR coalesce(p_archive, q.archive) OR p_now IS NOT NULL
       OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        RETURN QUERY SELECT * FROM {schema}._ack(q, p_ids, p_tokens, coalesce(p_archive, q.archive),
                                                 {schema}._now(p_now));
        RETURN;
    END IF;
    RETURN QUERY
    DELETE FROM {schema}.message m
     USING unnest(p_ids, p_tokens) AS t(id, token)
     WHERE m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token AND m.leased
    RETURNING m.id;
END $$;

SELECT {schema}._apply_privileges();
