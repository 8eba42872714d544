-- LonnyMQ's pgmq facade: a `pgmq` schema whose functions have pgmq 1.x's names, argument names,
-- types and result types, backed by the LonnyMQ queues of schema {schema}. Installed only on
-- request (`lonnymq migrate --pgmq`, `Client.migrate(pgmq=True)`); see docs/pgmq.md for how
-- pgmq's semantics map onto LonnyMQ's.
--
-- The message path is built on {schema}'s public API functions (queue_create, send, send_batch, pop,
-- take, take_tx, message_get, message_cancel, extend, nack, queue_metrics, queue_list,
-- queue_purge, queue_drop) and these functions are SECURITY INVOKER: a caller needs EXECUTE on
-- the {schema} functions it ends up calling. What that API has no function for (conditional
-- and grouped reads, set_vt of a message that is not leased, the q_/a_ views, insert
-- notifications, the wake-ups of the *_with_poll reads), and the one-id delete that every pgmq
-- consumer runs after each read (message_cancel's work for one message, in one statement), is
-- done on {schema}'s tables by a few SECURITY DEFINER functions ("Internal: on {schema}'s
-- tables" below, and delete), each granted only to the roles that may execute the {schema}
-- function it stands for: the facade lets no role do more than {schema}'s own policy
-- (docs/security.md) allows.
--
-- State: the facade keeps pgmq's topic bindings and insert-notification settings in two
-- tables of its own (notify_insert_throttle, topic_bindings); a reinstall carries them over.
--
-- The wrappers on the message path (send, send_batch, read, pop: one call of a {schema} function
-- and a conversion of its arguments and rows) are SQL functions declared STABLE, so that the
-- planner inlines them: a query `SELECT * FROM pgmq.send(...)` is planned as the {schema}.send
-- call it wraps, with no function of its own to run (no PL/pgSQL call, statement, snapshot or
-- tuplestore of rows between the caller and {schema}). PostgreSQL inlines a set-returning SQL
-- function only when it is not VOLATILE; a VOLATILE one runs through the SQL-function executor,
-- which plans its body again on every call (benchmarks/pgmq_facade.py: send at 0.78x of native
-- that way, 0.99x as a PL/pgSQL wrapper). STABLE is safe here although they write: each body is
-- one SELECT whose only effect is the call of the VOLATILE {schema} function, which takes its
-- own snapshots whether the wrapper is inlined or not (a call in a select list is not inlined:
-- the SQL-function executor runs the SELECT in the caller's snapshot and the {schema} function
-- as always), and a set-returning function is never evaluated early by the planner (it folds
-- STABLE scalar calls for estimates only). tests/pgmq/test_facade_plans.py checks the inlining.
--
-- Payloads: pgmq's jsonb message is stored as its JSON text in UTF-8 with content type
-- application/json, which is what LonnyMQ's JSON serializer writes, so messages interoperate
-- both ways. A message with another content type reads as a JSON string (text/*: the text;
-- anything else: base64). Times: LonnyMQ's epoch milliseconds become timestamptz.
--
-- The schema's comment marks it as this facade ('LonnyMQ pgmq facade over schema <schema>;
-- sha256 <checksum of this file>'): install refuses any other pgmq schema, migrate(pgmq=True)
-- skips an install whose checksum is current, and reinstalling drops and recreates the whole
-- schema (it holds no messages; its two state tables are carried over; objects of yours that
-- depend on its types or views go with it). Template:
-- {schema} is the quoted schema identifier, {schema_name} its string literal, {checksum} the
-- file's checksum as a literal; literal braces are doubled.

DO $install$
DECLARE
    v_comment text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pgmq') THEN
        RAISE EXCEPTION 'the pgmq extension is installed in this database; LonnyMQ''s pgmq facade '
            'cannot replace it (DROP EXTENSION pgmq first, after moving its queues)'
            USING ERRCODE = '55000';
    END IF;
    SELECT pg_catalog.obj_description(n.oid, 'pg_namespace') INTO v_comment
      FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgmq';
    IF FOUND THEN
        IF pg_catalog.split_part(coalesce(v_comment, ''), '; sha256 ', 1)
           IS DISTINCT FROM 'LonnyMQ pgmq facade over schema ' || {schema_name} THEN
            RAISE EXCEPTION 'a schema named pgmq exists that is not LonnyMQ''s pgmq facade over schema %'
                ' (comment: %); refusing to replace it', {schema_name}, coalesce(v_comment, 'none')
                USING ERRCODE = '55000';
        END IF;
        -- The facade's own state (topic bindings, insert notifications) survives a reinstall:
        -- kept in temporary tables here, put back at the end of this file.
        DROP TABLE IF EXISTS pg_temp.pgmq_keep_bindings, pg_temp.pgmq_keep_notify;
        IF pg_catalog.to_regclass('pgmq.topic_bindings') IS NOT NULL THEN
            CREATE TEMPORARY TABLE pgmq_keep_bindings AS
                SELECT b.pattern, b.queue_name, b.bound_at FROM pgmq.topic_bindings b;
        END IF;
        IF pg_catalog.to_regclass('pgmq.notify_insert_throttle') IS NOT NULL THEN
            CREATE TEMPORARY TABLE pgmq_keep_notify AS
                SELECT t.queue_name, t.throttle_interval_ms FROM pgmq.notify_insert_throttle t;
        END IF;
        DROP SCHEMA pgmq CASCADE;
    END IF;
    CREATE SCHEMA pgmq;
    EXECUTE pg_catalog.format('COMMENT ON SCHEMA pgmq IS %L',
                              'LonnyMQ pgmq facade over schema ' || {schema_name} || '; sha256 ' || {checksum});
END $install$;

-- Result types, with pgmq 1.13's columns.
CREATE TYPE pgmq.message_record AS (
    msg_id       bigint,
    read_ct      integer,
    enqueued_at  timestamptz,
    last_read_at timestamptz,
    vt           timestamptz,
    message      jsonb,
    headers      jsonb
);

CREATE TYPE pgmq.queue_record AS (
    queue_name     varchar,
    is_partitioned boolean,
    is_unlogged    boolean,
    created_at     timestamptz
);

CREATE TYPE pgmq.metrics_result AS (
    queue_name           text,
    queue_length         bigint,
    newest_msg_age_sec   integer,
    oldest_msg_age_sec   integer,
    total_messages       bigint,
    scrape_time          timestamptz,
    queue_visible_length bigint,
    -- pgmq: messages in a partitioned queue's default partition; NULL (no partitions here).
    default_partition_length bigint
);

-- State: the two tables of pgmq's that hold settings rather than messages. Read through the
-- facade's functions; written only by its SECURITY DEFINER functions (see Privileges).

-- Queues whose sends NOTIFY pgmq.q_<queue>.INSERT (enable_notify_insert). queue_id is the
-- LonnyMQ queue's id, which the trigger on {schema}.message matches (_notify_sync).
CREATE TABLE pgmq.notify_insert_throttle (
    queue_name           varchar NOT NULL CONSTRAINT notify_insert_throttle_queue_name_key UNIQUE,
    throttle_interval_ms integer NOT NULL DEFAULT 0 CHECK (throttle_interval_ms >= 0),
    last_notified_at     timestamptz NOT NULL DEFAULT pg_catalog.to_timestamp(0),
    queue_id             integer NOT NULL
);

-- Topic bindings (bind_topic): a send_topic whose routing key matches pattern goes to
-- queue_name. compiled_regex is pattern as an anchored regular expression (_topic_regex).
CREATE TABLE pgmq.topic_bindings (
    pattern        text NOT NULL,
    queue_name     text NOT NULL,
    bound_at       timestamptz NOT NULL DEFAULT now(),
    compiled_regex text NOT NULL,
    CONSTRAINT topic_bindings_unique_pattern_queue UNIQUE (pattern, queue_name)
);

-- Helpers ------------------------------------------------------------------------------------

-- A stored payload as pgmq's jsonb message: application/json as JSON, text/* as a JSON string,
-- anything else as a JSON string of its base64. NULL payload gives NULL.
-- These three helpers are STABLE, as the functions they call are (convert_from, to_jsonb,
-- extract from timestamptz): the planner then inlines them into the statement that calls them.
-- Declared IMMUTABLE they were not inlined (the planner refuses to inline an IMMUTABLE SQL
-- function whose body is not), and each call of a statement ran every one of them through the
-- SQL-function executor, which parses and plans its body anew each time (PostgreSQL 15: about
-- 140 us of a pgmq.read's 750).
CREATE FUNCTION pgmq._message(p_payload bytea, p_content_type text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN $2 = 'application/json' THEN pg_catalog.convert_from($1, 'UTF8')::jsonb
                WHEN $2 LIKE 'text/%' THEN pg_catalog.to_jsonb(pg_catalog.convert_from($1, 'UTF8'))
                ELSE pg_catalog.to_jsonb(pg_catalog.encode($1, 'base64')) END
$$;

-- Epoch milliseconds as timestamptz (NULL stays NULL). In float8, not numeric: to_timestamp
-- takes float8 seconds, and ms / 1000.0 in numeric (exact) then cast to float8 gives the
-- double nearest the exact quotient, which is what the IEEE division of the exactly converted
-- ms gives (|ms| < 2^53, year 287,396 and on: past any timestamp LonnyMQ stores) at a fifth of
-- the instructions (numeric_div, then numeric_float8's text round trip: ~2.8k a call, two a
-- message read; benchmarks/server_instructions.py, workloads pgmq_*).
CREATE FUNCTION pgmq._ts(p_ms bigint) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.to_timestamp($1::float8 / 1000)
$$;

-- timestamptz as epoch milliseconds (NULL stays NULL).
CREATE FUNCTION pgmq._ms(p_at timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (extract(epoch FROM $1) * 1000)::bigint
$$;

-- Internal: on {schema}'s tables -----------------------------------------------------------
-- What {schema}'s API has no function for (a filtered or grouped read, a new visibility time
-- for a message that is not leased, the views, insert notifications) is done here, on its
-- tables, by SECURITY DEFINER functions with a pinned search_path. Each names the {schema}
-- function whose privilege it stands for ("As: take"): install grants it only to the roles
-- that may execute that function, so the facade still lets no role do more than {schema}'s
-- own policy allows (see Privileges at the end). Messages of channels are left to {schema}'s
-- own functions: these touch plain messages (channel IS NULL) only.

-- Lease messages p_ids (locked by the caller, in that order) for p_vt seconds through
-- {schema}._deliver, as take does; the deliveries as message_records. Runs inside the
-- SECURITY DEFINER functions below only (a role calling it lacks EXECUTE on _deliver).
CREATE FUNCTION pgmq._lease(q {schema}.queue, p_ids bigint[], p_vt integer, p_now bigint)
RETURNS SETOF pgmq.message_record
LANGUAGE sql VOLATILE AS $$
    SELECT d.id, d.attempt, pgmq._ts(d.enqueued_at), pgmq._ts(p_now), pgmq._ts(d.lease_until),
           pgmq._message(d.payload, d.content_type), d.headers
      FROM {schema}._deliver(q, p_ids, 'lease', greatest(p_vt::bigint * 1000, 1), p_now) d
$$;

-- pgmq's conditional read: lease up to p_qty visible messages whose message contains
-- p_conditional (jsonb @>), oldest id first, skipping rows others hold. A filter, not an
-- index: it reads the queue's messages in id order until it has p_qty (as pgmq does).
-- As: take. Locks: the rows it leases (FOR UPDATE SKIP LOCKED).
CREATE FUNCTION pgmq._read_where(p_queue text, p_vt integer, p_qty integer, p_conditional jsonb)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q     {schema}.queue := {schema}._queue(p_queue);
    v_now bigint := {schema}.now_ms();
    v_ids bigint[];
BEGIN
    PERFORM {schema}._check_limit(p_qty);
    SELECT array_agg(c.id ORDER BY c.id) INTO v_ids
      FROM (SELECT m.id FROM {schema}.message m
             WHERE m.queue_id = q.id AND m.channel IS NULL AND m.superseded_by IS NULL
               AND m.dequeue_at <= v_now AND m.attempts < q.max_attempts
               AND pgmq._message(m.payload, m.content_type) @> p_conditional
             ORDER BY m.id
             LIMIT p_qty
               FOR UPDATE SKIP LOCKED) c;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM pgmq._lease(q, v_ids, p_vt, v_now);
    END IF;
END $$;

-- pgmq's FIFO groups: a message's group is its header x-pgmq-group (none: one default group).
-- A group may be read only from its oldest live message (its head) on, and not at all while a
-- message of it is in flight or scheduled ahead: a group's messages are leased in id order,
-- each run up to the first message that is not visible. p_mode: 'fill' (read_grouped: fill
-- the batch from the group with the oldest head, then the next), 'rr' (read_grouped_rr: the
-- first message of every group, then the second, ...), 'head' (read_grouped_head: one per
-- group). Reads every live plain message of the queue to find the heads (pgmq scans its table
-- the same way), then the runs of the p_qty groups with the oldest visible heads. As: take.
-- Locks: the heads picked, then the rest of their runs (FOR UPDATE SKIP LOCKED), only those: a
-- group another reader is taking is skipped, and the batch may then be short.
CREATE FUNCTION pgmq._read_grouped(p_queue text, p_vt integer, p_qty integer, p_mode text)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q        {schema}.queue := {schema}._queue(p_queue);
    v_now    bigint := {schema}.now_ms();
    v_heads  bigint[];
    v_groups text[];
    v_ids    bigint[];
    v_gidx   integer[];
    v_got    bigint[];
BEGIN
    PERFORM {schema}._check_limit(p_qty);
    -- 1. Groups whose head is visible, oldest head first; at most p_qty.
    SELECT array_agg(h.id ORDER BY h.id), array_agg(h.grp ORDER BY h.id) INTO v_heads, v_groups
      FROM (SELECT m.id, g.grp
              FROM (SELECT DISTINCT ON (x.grp) x.grp, x.id
                      FROM (SELECT coalesce(m.headers ->> 'x-pgmq-group', '_default_fifo_group') AS grp, m.id
                              FROM {schema}.message m
                             WHERE m.queue_id = q.id AND m.channel IS NULL
                               AND m.superseded_by IS NULL) x
                     ORDER BY x.grp, x.id) g
              JOIN {schema}.message m ON m.queue_id = q.id AND m.id = g.id
             WHERE m.dequeue_at <= v_now AND m.attempts < q.max_attempts
             ORDER BY m.id
             LIMIT p_qty) h;
    IF v_heads IS NULL THEN
        RETURN;
    END IF;
    -- 2. Each group's run from its head, in id order, up to the first message not visible;
    -- the batch picked from the runs in the mode's order.
    SELECT array_agg(r.id ORDER BY r.pick), array_agg(r.gi::integer ORDER BY r.pick) INTO v_ids, v_gidx
      FROM (SELECT u.id, u.gi,
                   row_number() OVER (ORDER BY CASE WHEN p_mode = 'rr' THEN u.rank ELSE 0 END,
                                               u.gi, u.rank) AS pick
              FROM (SELECT h.gi, x.id, row_number() OVER (PARTITION BY h.gi ORDER BY x.id) AS rank,
                           bool_and(x.visible) OVER (PARTITION BY h.gi ORDER BY x.id) AS open
                      FROM unnest(v_heads, v_groups) WITH ORDINALITY AS h(head, grp, gi)
                     CROSS JOIN LATERAL (
                           SELECT m.id, m.dequeue_at <= v_now AND m.attempts < q.max_attempts AS visible
                             FROM {schema}.message m
                            WHERE m.queue_id = q.id AND m.id >= h.head AND m.channel IS NULL
                              AND m.superseded_by IS NULL
                              AND coalesce(m.headers ->> 'x-pgmq-group', '_default_fifo_group') = h.grp
                            ORDER BY m.id
                            LIMIT CASE WHEN p_mode = 'head' THEN 1 ELSE p_qty END) x) u
             WHERE u.open) r
     WHERE r.pick <= p_qty;
    -- 3. Lock the picked messages, rechecking that they are still visible; a run stops before
    -- a message another transaction holds or has just leased (a group whose head is being read
    -- elsewhere drops out), so that no group is read out of order.
    -- Heads first, then the rest of the runs of the groups whose head this call holds, so that
    -- a call that gets nothing holds nothing while it polls on.
    SELECT array_agg(l.id) INTO v_got
      FROM (SELECT m.id FROM {schema}.message m
             WHERE m.queue_id = q.id AND m.id = ANY (v_ids) AND m.id = ANY (v_heads)
               AND m.dequeue_at <= v_now
             ORDER BY m.id
               FOR UPDATE SKIP LOCKED) l;
    SELECT v_got || array_agg(l.id) INTO v_got
      FROM (SELECT m.id FROM {schema}.message m
             WHERE m.queue_id = q.id AND m.dequeue_at <= v_now
               AND m.id = ANY (ARRAY(SELECT u.id FROM unnest(v_ids, v_gidx) AS u(id, gi)
                                      WHERE v_heads[u.gi] = ANY (v_got) AND u.id <> v_heads[u.gi]))
             ORDER BY m.id
               FOR UPDATE SKIP LOCKED) l;
    SELECT array_agg(t.id ORDER BY t.ord) INTO v_ids
      FROM (SELECT u.id, u.ord,
                   bool_and(u.id = ANY (v_got)) OVER (PARTITION BY u.gi ORDER BY u.id) AS ok
              FROM unnest(v_ids, v_gidx) WITH ORDINALITY AS u(id, gi, ord)) t
     WHERE t.ok;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM pgmq._lease(q, v_ids, p_vt, v_now);
    END IF;
END $$;

-- pgmq's set_vt on plain messages of queue p_queue: each of p_ids becomes visible at p_vt,
-- whatever its state. A ready or scheduled message is rescheduled to p_vt (its priority kept,
-- as send does); a leased one keeps its lease and token and its lease now ends at p_vt (a time
-- now or past makes it available at once, as an expired lease: its next read counts as a new
-- attempt). read_ct is not changed. Returns the messages changed (channel messages are not:
-- see set_vt). As: extend. Locks: the rows, in id order (waits for a take that holds one).
CREATE FUNCTION pgmq._set_vt(p_queue text, p_ids bigint[], p_vt timestamptz)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q     {schema}.queue := {schema}._queue(p_queue);
    v_now bigint := {schema}.now_ms();
    v_at  bigint := pgmq._ms(p_vt);
BEGIN
    RETURN QUERY
    UPDATE {schema}.message m
       SET dequeue_at = CASE WHEN m.leased THEN v_at
                             ELSE {schema}._dequeue_at(v_at, m.priority, q.priority_step_ms, v_now) END,
           scheduled_at = CASE WHEN m.leased THEN m.scheduled_at ELSE v_at END
     WHERE m.queue_id = q.id AND m.id = ANY (p_ids) AND m.channel IS NULL AND m.superseded_by IS NULL
    RETURNING m.id, m.attempts, pgmq._ts(m.enqueued_at), NULL::timestamptz, p_vt,
              pgmq._message(m.payload, m.content_type), m.headers;
END $$;

-- For read_with_poll's wake-ups: the id of queue p_queue and the class of its send lock
-- (wait.sql's _wait_keys). As: take.
CREATE FUNCTION pgmq._wait_key(p_queue text, OUT queue_id integer, OUT send_class integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    queue_id := ({schema}._queue(p_queue)).id;
    send_class := ({schema}._wait_keys(queue_id)).k_send;
END $$;

-- For read_with_poll's wake-ups: the last message id any send drew (the message id sequence;
-- NULL before the first). It moves when a send starts inserting, before it commits. As: take.
CREATE FUNCTION pgmq._last_id() RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_sequence_last_value(pg_get_serial_sequence(format('%I.message', {schema_name}), 'id')::regclass)
$$;

-- Wait until the sends of queue p_queue_id that are still in their transaction have ended, at
-- most until p_until: every send holds the queue's send lock shared until it ends (wait.sql),
-- so taking it exclusively waits for exactly those. Released at once. A send that starts
-- meanwhile does not wait for this one (it finds the lock taken and notifies instead).
CREATE FUNCTION pgmq._wait_sends(p_queue_id integer, p_class integer, p_until timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout',
        greatest(1, (extract(epoch FROM p_until - clock_timestamp()) * 1000)::bigint)::text || 'ms', true);
    BEGIN
        PERFORM pg_advisory_lock(p_class, p_queue_id);
        PERFORM pg_advisory_unlock(p_class, p_queue_id);
    EXCEPTION WHEN lock_not_available THEN
        NULL;  -- a send's transaction outlives the poll: the caller looks once more and returns
    END;
    PERFORM set_config('lock_timeout', v_timeout, true);
END $$;

-- The *_with_poll loop: read (p_kind 'read', with conditional, or a _read_grouped mode) until
-- messages come or max_poll_seconds pass. Between two looks it sleeps poll_interval_ms but
-- wakes early for a send: every 10 ms it checks whether a send drew a message id since its
-- last look (a sequence read, no table access) and if so waits for the queue's sends still
-- committing (_wait_sends) and looks at once. A function cannot receive NOTIFY (PostgreSQL
-- delivers it between transactions), so this is how a send wakes it; poll_interval_ms stays
-- the fallback for what no send announces (expired leases, scheduled messages coming due).
CREATE FUNCTION pgmq._poll(
    p_kind           text,
    queue_name       text,
    vt               integer,
    qty              integer,
    max_poll_seconds integer,
    poll_interval_ms integer,
    conditional      jsonb
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_until timestamptz := clock_timestamp() + make_interval(secs => max_poll_seconds);
    v_key   record := pgmq._wait_key(queue_name);
    v_next  timestamptz;
    v_seen  bigint;
    v_woken boolean := false;
BEGIN
    LOOP
        v_seen := pgmq._last_id();
        IF p_kind = 'read' THEN
            RETURN QUERY SELECT * FROM pgmq.read(queue_name, vt, qty, conditional);
        ELSE
            RETURN QUERY SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, p_kind);
        END IF;
        IF FOUND OR clock_timestamp() >= v_until THEN
            RETURN;
        END IF;
        -- After a wake-up that found nothing (the id was another queue's, or its send could not
        -- hold the send lock and may not have committed yet), look again soon.
        v_next := least(clock_timestamp() + make_interval(
                            secs => CASE WHEN v_woken THEN least(poll_interval_ms, 20)
                                         ELSE poll_interval_ms END / 1000.0),
                        v_until);
        v_woken := false;
        LOOP
            EXIT WHEN clock_timestamp() >= v_next;
            IF pgmq._last_id() IS DISTINCT FROM v_seen THEN
                PERFORM pgmq._wait_sends(v_key.queue_id, v_key.send_class, v_until);
                v_woken := true;
                EXIT;
            END IF;
            PERFORM pg_sleep(least(0.01, greatest(extract(epoch FROM v_next - clock_timestamp()), 0)));
        END LOOP;
    END LOOP;
END $$;

-- Create (or replace) the views pgmq.q_<p_queue> (live messages) and pgmq.a_<p_queue> (the
-- archive) with the columns of pgmq's tables, over queue p_queue (by name: a queue dropped and
-- created again is seen by the same views). A name longer than 61 characters gets no views
-- (q_ + name would pass PostgreSQL's 63). SELECT goes to the roles that may execute
-- message_get (q_) and archive_list (a_). As: queue_create.
CREATE FUNCTION pgmq._views_create(p_queue text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_role text;
BEGIN
    IF length(p_queue) > 61 THEN
        RETURN;
    END IF;
    EXECUTE format(
        'CREATE OR REPLACE VIEW pgmq.%I AS'
        ' SELECT m.id AS msg_id, m.attempts AS read_ct, pgmq._ts(m.enqueued_at) AS enqueued_at,'
        '        NULL::timestamptz AS last_read_at, pgmq._ts(m.dequeue_at) AS vt,'
        '        pgmq._message(m.payload, m.content_type) AS message, m.headers'
        '   FROM %I.message m'
        '  WHERE m.queue_id = (SELECT q.id FROM %I.queue q WHERE q.name = %L)'
        '    AND m.superseded_by IS NULL',
        'q_' || p_queue, {schema_name}, {schema_name}, p_queue);
    EXECUTE format(
        'CREATE OR REPLACE VIEW pgmq.%I AS'
        ' SELECT a.id AS msg_id, a.attempts AS read_ct, pgmq._ts(a.enqueued_at) AS enqueued_at,'
        '        NULL::timestamptz AS last_read_at, pgmq._ts(a.archived_at) AS archived_at,'
        '        pgmq._ts(a.scheduled_at) AS vt, pgmq._message(a.payload, a.content_type) AS message,'
        '        a.headers'
        '   FROM %I.archive a'
        '  WHERE a.queue_id = (SELECT q.id FROM %I.queue q WHERE q.name = %L)',
        'a_' || p_queue, {schema_name}, {schema_name}, p_queue);
    EXECUTE format('REVOKE ALL ON pgmq.%I, pgmq.%I FROM PUBLIC', 'q_' || p_queue, 'a_' || p_queue);
    FOR v_role IN SELECT pgmq._roles_allowed('message_get') LOOP
        EXECUTE format('GRANT SELECT ON pgmq.%I TO %I', 'q_' || p_queue, v_role);
    END LOOP;
    FOR v_role IN SELECT pgmq._roles_allowed('archive_list') LOOP
        EXECUTE format('GRANT SELECT ON pgmq.%I TO %I', 'a_' || p_queue, v_role);
    END LOOP;
END $$;

-- What the facade keeps about queue p_queue, removed when it is dropped (_queue_changed): its
-- views, topic bindings and insert notifications.
CREATE FUNCTION pgmq._queue_forget(p_queue text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('DROP VIEW IF EXISTS pgmq.%I, pgmq.%I', 'q_' || p_queue, 'a_' || p_queue);
    DELETE FROM pgmq.topic_bindings b WHERE b.queue_name = p_queue;
    DELETE FROM pgmq.notify_insert_throttle t WHERE t.queue_name = p_queue;
    IF FOUND THEN
        PERFORM pgmq._notify_sync();
    END IF;
END $$;

-- The LonnyMQ roles (security_role, existing) that may execute {schema}'s function p_function.
CREATE FUNCTION pgmq._roles_allowed(p_function text) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT s.rolname::text FROM {schema}.security_role s
     WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = s.rolname)
       AND EXISTS (SELECT FROM pg_catalog.pg_proc p
                    WHERE p.pronamespace = {schema_name}::regnamespace AND p.proname = p_function
                      AND pg_catalog.has_function_privilege(s.rolname, p.oid, 'EXECUTE'))
$$;

-- The trigger behind enable_notify_insert: after a message is inserted into a queue with
-- notifications on, NOTIFY pgmq.q_<queue>.INSERT (empty payload) unless one was sent less
-- than throttle_interval_ms ago. Writes notify_insert_throttle (last_notified_at).
CREATE FUNCTION pgmq._notify_insert() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_name varchar;
BEGIN
    UPDATE pgmq.notify_insert_throttle t SET last_notified_at = clock_timestamp()
     WHERE t.queue_id = NEW.queue_id
       AND (t.throttle_interval_ms = 0
            OR clock_timestamp() - t.last_notified_at >= t.throttle_interval_ms * interval '1 millisecond')
    RETURNING t.queue_name INTO v_name;
    IF v_name IS NOT NULL THEN
        PERFORM pg_notify('pgmq.q_' || v_name || '.INSERT', NULL);
    END IF;
    RETURN NULL;
END $$;

-- (Re)create the trigger pgmq_notify_insert on {schema}.message for exactly the queues in
-- notify_insert_throttle, or drop it when there is none. Its WHEN clause lists their ids as
-- constants: a send to any other queue pays one integer comparison per message and calls
-- nothing; with no queue enabled there is no trigger at all. DDL on the message table: every
-- take and send queues behind a waiting lock request, so each attempt waits at most 100 ms
-- (lock_timeout) and gives way; up to 50 attempts, 100 ms apart, then SQLSTATE 55P03 (a long
-- transaction that has read the message table, such as a forgotten BEGIN, holds it off).
CREATE FUNCTION pgmq._notify_sync() RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ids     integer[];
    v_timeout text := current_setting('lock_timeout');
BEGIN
    SELECT array_agg(t.queue_id ORDER BY t.queue_id) INTO v_ids FROM pgmq.notify_insert_throttle t;
    PERFORM set_config('lock_timeout', '100ms', true);
    FOR v_try IN 1..50 LOOP
        BEGIN
            IF EXISTS (SELECT FROM pg_catalog.pg_trigger t
                        WHERE t.tgname = 'pgmq_notify_insert'
                          AND t.tgrelid = format('%I.message', {schema_name})::regclass) THEN
                EXECUTE format('DROP TRIGGER pgmq_notify_insert ON %I.message', {schema_name});
            END IF;
            IF v_ids IS NOT NULL THEN
                EXECUTE format('CREATE TRIGGER pgmq_notify_insert AFTER INSERT ON %I.message FOR EACH ROW'
                               ' WHEN (NEW.queue_id = ANY (%L::integer[])) EXECUTE FUNCTION pgmq._notify_insert()',
                               {schema_name}, v_ids);
            END IF;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            IF v_try = 50 THEN
                RAISE;
            END IF;
            PERFORM pg_sleep(0.1);
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', v_timeout, true);
END $$;

-- Keeps the views, topic bindings and insert notifications in step with the queues, whichever
-- API creates or drops them: after a row of {schema}.queue is inserted, the queue's views are
-- created; after one is deleted, _queue_forget. Queues are created and dropped rarely; sends
-- and reads do not touch the queue table's rows, so they never fire it.
CREATE FUNCTION pgmq._queue_changed() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pgmq._views_create(NEW.name);
    ELSE
        PERFORM pgmq._queue_forget(OLD.name);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER pgmq_queue_changed AFTER INSERT OR DELETE ON {schema}.queue
    FOR EACH ROW EXECUTE FUNCTION pgmq._queue_changed();

-- plpgsql_check (tools/sqlcheck.py) checks a trigger function against a table it is attached
-- to, and _notify_insert is attached to {schema}.message only while a queue has notifications
-- on. This trigger gives it a table with the same queue_id column at all times; WHEN (false):
-- it never fires.
CREATE TRIGGER check_anchor AFTER INSERT ON pgmq.notify_insert_throttle
    FOR EACH ROW WHEN (false) EXECUTE FUNCTION pgmq._notify_insert();

-- Queues -------------------------------------------------------------------------------------

-- pgmq's name rules: at most 47 characters (pgmq builds table names from it), none of $ ; -- '.
-- LonnyMQ's own rules (queue_create) apply on top: a-z 0-9 _ . : - starting with a letter.
CREATE FUNCTION pgmq.validate_queue_name(queue_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF length(queue_name) > 47 THEN
        RAISE EXCEPTION 'queue name is too long, maximum length is 47 characters';
    END IF;
    IF queue_name ~ '\$|;|--|''' THEN
        RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or \''';
    END IF;
END $$;

-- Create queue queue_name if it does not exist (pgmq's create is idempotent), with its views
-- pgmq.q_<queue_name> and pgmq.a_<queue_name> (_queue_changed; created again here, in case
-- they were dropped by hand). A pgmq queue has no attempt limit, so the LonnyMQ queue gets the
-- largest max_attempts; leases default to 30 s but each read gives its own vt.
CREATE FUNCTION pgmq.create_non_partitioned(queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM {schema}.queue_create(queue_name, p_max_attempts => 2147483647, p_if_not_exists => true);
    PERFORM pgmq._views_create(queue_name);
END $$;

CREATE FUNCTION pgmq.create(queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pgmq.create_non_partitioned(queue_name);
END $$;

-- Arguments accepted for compatibility (pgmq 1.13's premake included); LonnyMQ's storage is not
-- partitioned per queue.
CREATE FUNCTION pgmq.create_partitioned(
    queue_name         text,
    partition_interval text    DEFAULT '10000',
    retention_interval text    DEFAULT '100000',
    premake            integer DEFAULT 4
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
-- partition_interval and retention_interval are pgmq's, accepted and unused on purpose.
-- @plpgsql_check_options: extra_warnings = false
BEGIN
    IF premake < 1 THEN
        RAISE EXCEPTION 'premake must be at least 1, got %', premake;
    END IF;
    PERFORM pgmq.create_non_partitioned(queue_name);
END $$;

CREATE FUNCTION pgmq.create_unlogged(queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM {schema}.queue_create(queue_name, p_max_attempts => 2147483647, p_unlogged => true,
                                  p_if_not_exists => true);
    PERFORM pgmq._views_create(queue_name);
END $$;

-- Drop queue queue_name with its messages and archive, its views, topic bindings and insert
-- notifications (_queue_changed). Returns false if it did not exist.
CREATE FUNCTION pgmq.drop_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN {schema}.queue_drop(queue_name, p_if_exists => true);
END $$;

-- Deprecated in pgmq; the flag is ignored.
CREATE FUNCTION pgmq.drop_queue(queue_name text, partitioned boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
-- partitioned is pgmq's, accepted and unused on purpose.
-- @plpgsql_check_options: extra_warnings = false
BEGIN
    RETURN pgmq.drop_queue(queue_name);
END $$;

-- Delete every message of queue queue_name; returns how many there were.
CREATE FUNCTION pgmq.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_count bigint;
BEGIN
    SELECT m.ready + m.scheduled + m.leased INTO v_count FROM {schema}.queue_metrics(queue_name) m;
    PERFORM {schema}.queue_purge(queue_name);
    RETURN v_count;
END $$;

-- Every LonnyMQ queue, whichever API created it.
CREATE FUNCTION pgmq.list_queues() RETURNS SETOF pgmq.queue_record
LANGUAGE sql STABLE AS $$
    SELECT q.name::varchar, false, q.unlogged, q.created_at FROM {schema}.queue_list() q
$$;

-- Send ---------------------------------------------------------------------------------------

-- The one send: messages msgs with headers (NULL or one per message) visible from p_at, or
-- p_delay seconds from now (clock_timestamp(), as pgmq computes it; negative: past), or now
-- (both NULL). Returns the new ids in order. Raises LonnyMQ's LQ001 for an unknown queue. The
-- messages go as their JSON text in UTF-8, content type application/json, in one ARRAY(...).
-- Every send_batch overload is this one with NULLs for what it lacks, and each is inlined (see
-- the top) down to {schema}.send_batch: the overloads pass only their own arguments, never an
-- expression such as clock_timestamp() + delay (PostgreSQL does not inline a call with a
-- volatile argument), and the planner folds the branches of the NULLs away.
CREATE FUNCTION pgmq._send_batch(
    p_queue text, p_msgs jsonb[], p_headers jsonb[], p_at timestamptz, p_delay integer
) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s.id FROM {schema}.send_batch(
        $1,
        ARRAY(SELECT pg_catalog.convert_to(m::text, 'UTF8') FROM unnest($2) AS m),
        p_content_types => array_fill('application/json'::text, ARRAY[cardinality($2)]),
        p_headers => $3,
        p_at_ms => CASE WHEN $4 IS NOT NULL THEN array_fill(pgmq._ms($4), ARRAY[cardinality($2)])
                        WHEN $5 IS NOT NULL
                        THEN array_fill(pgmq._ms(clock_timestamp() + make_interval(secs => $5)),
                                        ARRAY[cardinality($2)]) END
    ) s ORDER BY s.ord
$$;

CREATE FUNCTION pgmq.send_batch(
    queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz
) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send_batch($1, $2, $3, $4, NULL) s
$$;

-- The plain batch, what pgmq's clients send most.
CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[]) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send_batch($1, $2, NULL, NULL, NULL) s
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[]) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send_batch($1, $2, $3, NULL, NULL) s
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay integer) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send_batch($1, $2, NULL, NULL, $3) s
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay timestamptz) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send_batch($1, $2, NULL, $3, NULL) s
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send_batch($1, $2, $3, NULL, $4) s
$$;

-- One message: LonnyMQ's lean send (one statement), not send_batch. The same scheme as
-- send_batch's: every overload is _send with NULLs for what it lacks, inlined down to
-- {schema}.send.
CREATE FUNCTION pgmq._send(p_queue text, p_msg jsonb, p_headers jsonb, p_at timestamptz, p_delay integer)
RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s.id FROM {schema}.send(
        $1, pg_catalog.convert_to($2::text, 'UTF8'), p_content_type => 'application/json',
        p_headers => $3,
        p_at_ms => CASE WHEN $4 IS NOT NULL THEN pgmq._ms($4)
                        WHEN $5 IS NOT NULL THEN pgmq._ms(clock_timestamp() + make_interval(secs => $5)) END) s
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay timestamptz)
RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send($1, $2, $3, $4, NULL) s
$$;

-- The plain send, what pgmq's clients send most: LonnyMQ's send_plain (send()'s plain case
-- with a scalar result, sql/send.sql), inlined here as _send is.
CREATE FUNCTION pgmq.send(queue_name text, msg jsonb) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT {schema}.send_plain($1, pg_catalog.convert_to($2::text, 'UTF8'), 'application/json')
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send($1, $2, $3, NULL, NULL) s
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send($1, $2, NULL, NULL, $3) s
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, delay timestamptz) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send($1, $2, NULL, $3, NULL) s
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT s FROM pgmq._send($1, $2, $3, NULL, $4) s
$$;

-- Read ---------------------------------------------------------------------------------------

-- Lease up to qty ready messages for vt seconds (LonnyMQ's take; read_ct is the attempt
-- count). With a conditional other than '{{}}', only messages whose message contains it
-- (jsonb @>), oldest id first (_read_where).
-- An inlined SQL function (see the top): of the two branches, the planner keeps the one the
-- conditional picks when it is a constant (a call without one: take alone), else both under
-- one-time filters, which run only the branch that applies.
CREATE FUNCTION pgmq.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{{}}')
RETURNS SETOF pgmq.message_record
LANGUAGE sql STABLE AS $$
    SELECT d.id, d.attempt, pgmq._ts(d.enqueued_at), clock_timestamp(), pgmq._ts(d.lease_until),
           pgmq._message(d.payload, d.content_type), d.headers
      FROM {schema}.take($1, $3, greatest($2::bigint * 1000, 1)) d
     WHERE $4 IS NULL OR $4 = '{{}}'::jsonb
    UNION ALL
    SELECT * FROM pgmq._read_where($1, $2, $3, $4) WHERE $4 <> '{{}}'::jsonb
$$;

-- read until a message comes or max_poll_seconds pass, woken early by sends (_poll).
CREATE FUNCTION pgmq.read_with_poll(
    queue_name       text,
    vt               integer,
    qty              integer,
    max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100,
    conditional      jsonb   DEFAULT '{{}}'
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._poll('read', queue_name, vt, qty, max_poll_seconds,
                                          poll_interval_ms, conditional);
END $$;

-- FIFO groups by the x-pgmq-group header (_read_grouped has the rules): read_grouped fills the
-- batch from the oldest group first, read_grouped_rr takes one message of each group per round,
-- read_grouped_head the head of each group only.
CREATE FUNCTION pgmq.read_grouped(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 'fill');
END $$;

CREATE FUNCTION pgmq.read_grouped_rr(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 'rr');
END $$;

CREATE FUNCTION pgmq.read_grouped_head(queue_name text, vt integer, qty integer)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 'head');
END $$;

CREATE FUNCTION pgmq.read_grouped_with_poll(
    queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._poll('fill', queue_name, vt, qty, max_poll_seconds,
                                          poll_interval_ms, NULL);
END $$;

CREATE FUNCTION pgmq.read_grouped_rr_with_poll(
    queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._poll('rr', queue_name, vt, qty, max_poll_seconds,
                                          poll_interval_ms, NULL);
END $$;

CREATE FUNCTION pgmq.read_grouped_head_with_poll(
    queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._poll('head', queue_name, vt, qty, max_poll_seconds,
                                          poll_interval_ms, NULL);
END $$;

-- pgmq indexes its headers for the grouped reads; the facade reads LonnyMQ's indexes. No-ops
-- (the queue must exist).
CREATE FUNCTION pgmq.create_fifo_index(queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM FROM {schema}.queue_metrics(queue_name);
END $$;

CREATE FUNCTION pgmq.create_fifo_indexes_all() RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN;
END $$;

-- Take up to qty ready messages and delete them at once (LonnyMQ's pop: take_tx, not
-- archived, one DELETE on a plain queue; called directly, not through {schema}.pop, which
-- would add a PL/pgSQL call and a copy of the rows).
-- An inlined SQL function (see the top).
CREATE FUNCTION pgmq.pop(queue_name text, qty integer DEFAULT 1) RETURNS SETOF pgmq.message_record
LANGUAGE sql STABLE AS $$
    SELECT d.id, d.attempt, pgmq._ts(d.enqueued_at), clock_timestamp(),
           pgmq._ts(coalesce(d.lease_until, d.scheduled_at)), pgmq._message(d.payload, d.content_type),
           d.headers
      FROM {schema}.take_tx($1, $2, false) d
$$;

-- Settle -------------------------------------------------------------------------------------

-- Delete messages by id, leased or not, without a fencing token (pgmq has none): LonnyMQ's
-- message_cancel. Returns the ids deleted.
CREATE FUNCTION pgmq.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT c FROM {schema}.message_cancel($1, $2, p_archive => false) c;
END $$;

-- One id, the call of a pgmq consumer after each read: message_cancel's work for one message
-- (deleted, counted as cancelled in queue_stat, out of its channel), but in one statement with
-- a plan kept for the session: message_cancel, for any ids and keys, locks, deletes and returns
-- in three statements that PL/pgSQL plans again on every call (custom plans for its array
-- parameters; 1,100 us a call there, 400 us for pgmq's own delete). The statement finds the
-- queue by name, deletes the row by its primary key and appends its queue_stat row, as ack's
-- one-statement ack does (settle.sql); only a miss looks at the queue again (an unknown queue
-- raises) and only a message of a channel takes a second step. Pinned plans, as the core's
-- entry points (generic, no sequential scan, no JIT; see settle.sql's header). Returns whether
-- it deleted it. Raises LQ001 for an unknown queue. As: message_cancel. Locks: the row (waiting
-- for a take that holds it, then deleting what it leased), then its channel.
CREATE FUNCTION pgmq.delete(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    v_now     bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    v_channel text;
    v_leased  boolean;
BEGIN
    WITH x AS (
        SELECT y.id FROM {schema}.queue y WHERE y.name = queue_name
    ), d AS (
        DELETE FROM {schema}.message m
         USING x
         WHERE m.queue_id = x.id AND m.id = msg_id
        RETURNING m.queue_id, m.channel, m.leased
    ), st AS (
        INSERT INTO {schema}.queue_stat (queue_id, minute, cancelled)
        SELECT d.queue_id, v_now / 60000, 1 FROM d
    )
    SELECT d.channel, d.leased INTO v_channel, v_leased FROM d;
    IF NOT FOUND THEN
        PERFORM {schema}._queue(queue_name);  -- raises LQ001 for an unknown queue
        RETURN false;
    END IF;
    IF v_channel IS NOT NULL THEN
        PERFORM {schema}._channel_apply({schema}._queue(queue_name), ARRAY[v_channel],
                                        ARRAY[-1::bigint], ARRAY[-v_leased::integer], v_now);
    END IF;
    RETURN true;
END $$;

-- Move messages by id to the queue's archive (status 'cancelled' in archive_list). Returns the
-- ids archived.
CREATE FUNCTION pgmq.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT c FROM {schema}.message_cancel($1, $2, p_archive => true) c;
END $$;

CREATE FUNCTION pgmq.archive(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT EXISTS (SELECT FROM {schema}.message_cancel($1, ARRAY[$2], p_archive => true)));
END $$;

-- Make each of msg_ids of queue queue_name visible at vt (invisible until then), whatever its
-- state, without counting a read; returns the messages changed (unknown ids are left out).
-- Plain messages: _set_vt. A message of a LonnyMQ channel is changed only while leased,
-- through {schema}.extend (vt in the future) or nack with no delay (vt now or past).
CREATE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt timestamptz)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_ms     bigint := pgmq._ms(vt) - pgmq._ms(clock_timestamp());
    v_ids    bigint[];
    v_tokens integer[];
BEGIN
    RETURN QUERY SELECT * FROM pgmq._set_vt(queue_name, msg_ids, vt);
    SELECT array_agg(g.id), array_agg(g.token) INTO v_ids, v_tokens
      FROM unnest(msg_ids) AS i(id)
     CROSS JOIN LATERAL {schema}.message_get(queue_name, i.id) g
     WHERE g.status = 'leased' AND g.channel IS NOT NULL;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    IF v_ms > 0 THEN
        PERFORM {schema}.extend(queue_name, v_ids, v_tokens, v_ms);
    ELSE
        PERFORM {schema}.nack(queue_name, v_ids, v_tokens,
                              p_delays_ms => array_fill(0::bigint, ARRAY[cardinality(v_ids)]));
    END IF;
    RETURN QUERY
    SELECT g.id, g.attempt, pgmq._ts(g.enqueued_at), NULL::timestamptz,
           pgmq._ts(coalesce(g.lease_until, g.scheduled_at)), pgmq._message(g.payload, g.content_type),
           g.headers
      FROM unnest(v_ids) AS i(id)
     CROSS JOIN LATERAL {schema}.message_get(queue_name, i.id) g;
END $$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt integer) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.set_vt($1, $2, clock_timestamp() + make_interval(secs => $3));
END $$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt timestamptz) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.set_vt($1, ARRAY[$2], $3);
END $$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt integer) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.set_vt($1, ARRAY[$2], clock_timestamp() + make_interval(secs => $3));
END $$;

-- Insert notifications -----------------------------------------------------------------------

-- From now on, a message inserted into queue queue_name (a send, whichever API) NOTIFYs
-- channel pgmq.q_<queue_name>.INSERT with an empty payload, at most once every
-- throttle_interval_ms (0: every insert; PostgreSQL folds the identical notifications of one
-- transaction into one). Sends to other queues do not pay for it (_notify_sync). Enabling a
-- queue that is already enabled changes its interval only. As: queue_create.
CREATE FUNCTION pgmq.enable_notify_insert(queue_name text, throttle_interval_ms integer DEFAULT 250)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id  integer;
    v_new boolean;
BEGIN
    IF throttle_interval_ms IS NULL OR throttle_interval_ms < 0 THEN
        RAISE EXCEPTION 'throttle_interval_ms must be non-negative';
    END IF;
    v_id := ({schema}._queue(queue_name)).id;
    v_new := NOT EXISTS (SELECT FROM pgmq.notify_insert_throttle t
                          WHERE t.queue_name = enable_notify_insert.queue_name AND t.queue_id = v_id);
    INSERT INTO pgmq.notify_insert_throttle AS t (queue_name, throttle_interval_ms, queue_id)
    VALUES (enable_notify_insert.queue_name, enable_notify_insert.throttle_interval_ms, v_id)
    ON CONFLICT ON CONSTRAINT notify_insert_throttle_queue_name_key DO UPDATE
       SET throttle_interval_ms = excluded.throttle_interval_ms,
           last_notified_at = pg_catalog.to_timestamp(0), queue_id = excluded.queue_id;
    IF v_new THEN
        PERFORM pgmq._notify_sync();
    END IF;
END $$;

-- Stop the notifications of queue queue_name (nothing happens if they were off). As: queue_create.
CREATE FUNCTION pgmq.disable_notify_insert(queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM pgmq.notify_insert_throttle t WHERE t.queue_name = disable_notify_insert.queue_name;
    IF FOUND THEN
        PERFORM pgmq._notify_sync();
    END IF;
END $$;

-- Change the throttle of a queue whose notifications are on. As: queue_create.
CREATE FUNCTION pgmq.update_notify_insert(queue_name text, throttle_interval_ms integer) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF throttle_interval_ms IS NULL OR throttle_interval_ms < 0 THEN
        RAISE EXCEPTION 'throttle_interval_ms must be non-negative, got: %', throttle_interval_ms;
    END IF;
    PERFORM {schema}._queue(queue_name);
    UPDATE pgmq.notify_insert_throttle t
       SET throttle_interval_ms = update_notify_insert.throttle_interval_ms,
           last_notified_at = pg_catalog.to_timestamp(0)
     WHERE t.queue_name = update_notify_insert.queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'Queue "%" does not have notify_insert enabled. Enable it first using pgmq.enable_notify_insert()',
            queue_name;
    END IF;
END $$;

CREATE FUNCTION pgmq.list_notify_insert_throttles()
RETURNS TABLE (queue_name text, throttle_interval_ms integer, last_notified_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT t.queue_name, t.throttle_interval_ms, t.last_notified_at
      FROM pgmq.notify_insert_throttle t ORDER BY t.queue_name
$$;

-- Topics -------------------------------------------------------------------------------------

-- A routing key: 1 to 255 characters of a-z A-Z 0-9 . _ -, dot-separated non-empty words.
-- Returns true or raises.
CREATE FUNCTION pgmq.validate_routing_key(routing_key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF routing_key IS NULL OR routing_key = '' THEN
        RAISE EXCEPTION 'routing_key cannot be NULL or empty';
    ELSIF length(routing_key) > 255 THEN
        RAISE EXCEPTION 'routing_key length cannot exceed 255 characters, got % characters', length(routing_key);
    ELSIF routing_key !~ '^[a-zA-Z0-9._-]+$' THEN
        RAISE EXCEPTION 'routing_key contains invalid characters. Only alphanumeric, dots, hyphens, and underscores are allowed. Got: %', routing_key;
    ELSIF left(routing_key, 1) = '.' THEN
        RAISE EXCEPTION 'routing_key cannot start with a dot. Got: %', routing_key;
    ELSIF right(routing_key, 1) = '.' THEN
        RAISE EXCEPTION 'routing_key cannot end with a dot. Got: %', routing_key;
    ELSIF strpos(routing_key, '..') > 0 THEN
        RAISE EXCEPTION 'routing_key cannot contain consecutive dots. Got: %', routing_key;
    END IF;
    RETURN true;
END $$;

-- A binding pattern: like a routing key, where a word may also be * (exactly one word) or #
-- (any number of words); no ** or ##, no wildcard next to another. Returns true or raises.
CREATE FUNCTION pgmq.validate_topic_pattern(pattern text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pattern IS NULL OR pattern = '' THEN
        RAISE EXCEPTION 'pattern cannot be NULL or empty';
    ELSIF length(pattern) > 255 THEN
        RAISE EXCEPTION 'pattern length cannot exceed 255 characters, got % characters', length(pattern);
    ELSIF pattern !~ '^[a-zA-Z0-9._*#-]+$' THEN
        RAISE EXCEPTION 'pattern contains invalid characters. Only alphanumeric, dots, hyphens, underscores, *, and # are allowed. Got: %', pattern;
    ELSIF left(pattern, 1) = '.' THEN
        RAISE EXCEPTION 'pattern cannot start with a dot. Got: %', pattern;
    ELSIF right(pattern, 1) = '.' THEN
        RAISE EXCEPTION 'pattern cannot end with a dot. Got: %', pattern;
    ELSIF strpos(pattern, '..') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive dots. Got: %', pattern;
    ELSIF strpos(pattern, '**') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive stars (**). Use # for multi-segment matching. Got: %', pattern;
    ELSIF strpos(pattern, '##') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive hashes (##). A single # already matches zero or more segments. Got: %', pattern;
    ELSIF strpos(pattern, '*#') > 0 OR strpos(pattern, '#*') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain adjacent wildcards (*# or #*). Separate wildcards with dots. Got: %', pattern;
    END IF;
    RETURN true;
END $$;

-- A valid pattern as an anchored regular expression: . matched literally, * one word
-- ([^.]+), # anything (.*), as pgmq compiles them.
CREATE FUNCTION pgmq._topic_regex(p_pattern text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT '^' || replace(replace(replace(p_pattern, '.', '\.'), '*', '[^.]+'), '#', '.*') || '$'
$$;

-- Route messages whose routing key matches pattern to queue queue_name (idempotent). Raises
-- for an invalid pattern or an unknown queue. As: queue_create.
CREATE FUNCTION pgmq.bind_topic(pattern text, queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgmq.validate_topic_pattern(pattern);
    IF queue_name IS NULL OR queue_name = '' THEN
        RAISE EXCEPTION 'queue_name cannot be NULL or empty';
    END IF;
    PERFORM {schema}._queue(queue_name);
    INSERT INTO pgmq.topic_bindings (pattern, queue_name, compiled_regex)
    VALUES (bind_topic.pattern, bind_topic.queue_name, pgmq._topic_regex(bind_topic.pattern))
    ON CONFLICT ON CONSTRAINT topic_bindings_unique_pattern_queue DO NOTHING;
END $$;

-- Remove a binding; returns whether it existed. As: queue_create.
CREATE FUNCTION pgmq.unbind_topic(pattern text, queue_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pattern IS NULL OR pattern = '' THEN
        RAISE EXCEPTION 'pattern cannot be NULL or empty';
    END IF;
    IF queue_name IS NULL OR queue_name = '' THEN
        RAISE EXCEPTION 'queue_name cannot be NULL or empty';
    END IF;
    DELETE FROM pgmq.topic_bindings b
     WHERE b.pattern = unbind_topic.pattern AND b.queue_name = unbind_topic.queue_name;
    RETURN FOUND;
END $$;

-- The bindings whose pattern matches routing_key, by pattern.
CREATE FUNCTION pgmq.test_routing(routing_key text)
RETURNS TABLE (pattern text, queue_name text, compiled_regex text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    RETURN QUERY SELECT b.pattern, b.queue_name, b.compiled_regex FROM pgmq.topic_bindings b
                  WHERE routing_key ~ b.compiled_regex ORDER BY b.pattern, b.queue_name;
END $$;

CREATE FUNCTION pgmq.list_topic_bindings()
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex FROM pgmq.topic_bindings b
     ORDER BY b.bound_at DESC, b.pattern, b.queue_name
$$;

CREATE FUNCTION pgmq.list_topic_bindings(queue_name text)
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex FROM pgmq.topic_bindings b
     WHERE b.queue_name = $1 ORDER BY b.bound_at DESC, b.pattern
$$;

-- The queues a routing key goes to (each once, by name); a binding whose queue was dropped
-- through LonnyMQ's API routes nowhere (pgmq drops such bindings with the queue). As: send_batch.
CREATE FUNCTION pgmq._routes(p_routing_key text) RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT DISTINCT b.queue_name FROM pgmq.topic_bindings b
     WHERE p_routing_key ~ b.compiled_regex
       AND EXISTS (SELECT FROM {schema}.queue q WHERE q.name = b.queue_name)
     ORDER BY b.queue_name
$$;

-- Send msg to every queue bound to a pattern that routing_key matches, in one transaction
-- (all or none); returns how many queues got it (0: no binding matched, nothing sent).
CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb, delay integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
-- plpgsql_check suggests STABLE: the sends it calls are declared STABLE to be inlined (see the
-- top) but write; this function writes through them, so VOLATILE it stays. Volatility is a
-- finding about the whole function, which only the in-comment option reaches.
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_queue text;
    v_n     integer := 0;
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    IF msg IS NULL THEN
        RAISE EXCEPTION 'msg cannot be NULL';
    END IF;
    IF delay < 0 THEN
        RAISE EXCEPTION 'delay cannot be negative, got: %', delay;
    END IF;
    FOR v_queue IN SELECT pgmq._routes(routing_key) LOOP
        PERFORM pgmq.send(v_queue, msg, headers, coalesce(delay, 0));
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END $$;

CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN pgmq.send_topic(routing_key, msg, NULL::jsonb, 0);
END $$;

CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, delay integer) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN pgmq.send_topic(routing_key, msg, NULL::jsonb, delay);
END $$;

-- Not in pgmq 1.13 (its Python client calls it for send_topic(..., headers=...)).
CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN pgmq.send_topic(routing_key, msg, headers, 0);
END $$;

-- send_batch to every queue whose binding matches routing_key; one row per message sent.
CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
-- plpgsql_check suggests STABLE: the sends it calls are declared STABLE to be inlined (see the
-- top) but write; this function writes through them, so VOLATILE it stays. Volatility is a
-- finding about the whole function, which only the in-comment option reaches.
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_queue text;
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    IF msgs IS NULL OR cardinality(msgs) = 0 THEN
        RAISE EXCEPTION 'msgs cannot be NULL or empty';
    END IF;
    IF headers IS NOT NULL AND cardinality(headers) <> cardinality(msgs) THEN
        RAISE EXCEPTION 'headers array length (%) must match msgs array length (%)',
            cardinality(headers), cardinality(msgs);
    END IF;
    FOR v_queue IN SELECT pgmq._routes(routing_key) LOOP
        RETURN QUERY SELECT v_queue, s.id FROM pgmq.send_batch(v_queue, msgs, headers, delay) AS s(id);
    END LOOP;
END $$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL::jsonb[], NULL::timestamptz);
END $$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, NULL::timestamptz);
END $$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL::jsonb[],
                                                      clock_timestamp() + make_interval(secs => delay));
END $$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL::jsonb[], delay);
END $$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers,
                                                      clock_timestamp() + make_interval(secs => delay));
END $$;

-- Metrics ------------------------------------------------------------------------------------

-- queue_length counts every live message (ready, scheduled, leased); queue_visible_length the
-- ready ones; total_messages every message ever sent to the queue.
CREATE FUNCTION pgmq.metrics(queue_name text) RETURNS pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT m.queue, m.ready + m.scheduled + m.leased, (m.newest_age_ms / 1000)::integer,
           (m.oldest_age_ms / 1000)::integer, m.total_sent, now(), m.ready, NULL::bigint
      FROM {schema}.queue_metrics($1) m
$$;

CREATE FUNCTION pgmq.metrics_all() RETURNS SETOF pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT pgmq.metrics(q.name) FROM {schema}.queue_list() q ORDER BY q.name
$$;

-- Privileges: nothing for PUBLIC. LonnyMQ's roles get USAGE, SELECT on the two state tables and
-- EXECUTE on every SECURITY INVOKER function here: what they can then do is decided by their
-- grants on the {schema} functions these call. A SECURITY DEFINER function goes only to the
-- roles that may execute the {schema} function it stands for (its "As:" line, the list below);
-- the others (the trigger functions, _queue_forget, _notify_sync) go to none. Re-run on every
-- install, so a change of the LonnyMQ roles' grants reaches the facade with the next
-- migrate(pgmq=True) after it.
DO $grant$
DECLARE
    v_role text;
    f      record;
BEGIN
    REVOKE ALL ON SCHEMA pgmq FROM PUBLIC;
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgmq FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA pgmq FROM PUBLIC;
    FOR v_role IN SELECT s.rolname FROM {schema}.security_role s
                   WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = s.rolname) LOOP
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA pgmq TO %I', v_role);
        EXECUTE pg_catalog.format('GRANT SELECT ON pgmq.notify_insert_throttle, pgmq.topic_bindings TO %I',
                                  v_role);
        FOR f IN SELECT p.oid::regprocedure AS sig, p.prosecdef, a.core
                   FROM pg_catalog.pg_proc p
                   LEFT JOIN (VALUES ('_read_where', 'take'), ('_read_grouped', 'take'),
                                     ('_wait_key', 'take'), ('_last_id', 'take'),
                                     ('_set_vt', 'extend'), ('delete', 'message_cancel'),
                                     ('_views_create', 'queue_create'),
                                     ('_routes', 'send_batch'),
                                     ('enable_notify_insert', 'queue_create'),
                                     ('disable_notify_insert', 'queue_create'),
                                     ('update_notify_insert', 'queue_create'),
                                     ('bind_topic', 'queue_create'),
                                     ('unbind_topic', 'queue_create')) AS a(fn, core) ON a.fn = p.proname
                  WHERE p.pronamespace = 'pgmq'::regnamespace LOOP
            IF NOT f.prosecdef OR v_role IN (SELECT pgmq._roles_allowed(f.core)) THEN
                EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', f.sig, v_role);
            END IF;
        END LOOP;
    END LOOP;
END $grant$;

-- pgmq's queue catalogue, which tools query directly: every LonnyMQ queue, as list_queues.
-- SELECT for the roles that may execute queue_list.
CREATE VIEW pgmq.meta AS
    SELECT q.name::varchar AS queue_name, false AS is_partitioned, q.unlogged AS is_unlogged,
           q.created_at
      FROM {schema}.queue q;
REVOKE ALL ON pgmq.meta FROM PUBLIC;
DO $meta$
DECLARE
    v_role text;
BEGIN
    FOR v_role IN SELECT pgmq._roles_allowed('queue_list') LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON pgmq.meta TO %I', v_role);
    END LOOP;
END $meta$;

-- The state a reinstall kept (see the top), and the views of every queue.
DO $restore$
DECLARE
    v_name text;
BEGIN
    IF pg_catalog.to_regclass('pg_temp.pgmq_keep_bindings') IS NOT NULL THEN
        INSERT INTO pgmq.topic_bindings (pattern, queue_name, bound_at, compiled_regex)
        SELECT k.pattern, k.queue_name, k.bound_at, pgmq._topic_regex(k.pattern)
          FROM pg_temp.pgmq_keep_bindings k
         WHERE EXISTS (SELECT FROM {schema}.queue q WHERE q.name = k.queue_name);
        DROP TABLE pg_temp.pgmq_keep_bindings;
    END IF;
    IF pg_catalog.to_regclass('pg_temp.pgmq_keep_notify') IS NOT NULL THEN
        INSERT INTO pgmq.notify_insert_throttle (queue_name, throttle_interval_ms, queue_id)
        SELECT k.queue_name, k.throttle_interval_ms, q.id
          FROM pg_temp.pgmq_keep_notify k JOIN {schema}.queue q ON q.name = k.queue_name;
        DROP TABLE pg_temp.pgmq_keep_notify;
        PERFORM pgmq._notify_sync();
    END IF;
    FOR v_name IN SELECT q.name FROM {schema}.queue q ORDER BY q.name LOOP
        PERFORM pgmq._views_create(v_name);
    END LOOP;
END $restore$;
