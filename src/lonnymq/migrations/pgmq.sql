-- LonnyMQ's pgmq facade: a `pgmq` schema whose functions have pgmq 1.x's names, argument names,
-- types and result types, backed by the LonnyMQ queues of schema {schema}. Installed only on
-- request (`lonnymq migrate --pgmq`, `Client.migrate(pgmq=True)`); see docs/pgmq.md for how
-- pgmq's semantics map onto LonnyMQ's.
--
-- It is built on {schema}'s public API functions only (queue_create, send_batch, take, take_tx,
-- message_get, message_cancel, extend, nack, queue_metrics, queue_list, queue_purge,
-- queue_drop), never on its tables, so it follows whatever storage {schema} has. Every function
-- here is SECURITY INVOKER: a caller needs EXECUTE on the {schema} functions it ends up calling,
-- so the facade grants nothing that {schema}'s own policy (docs/security.md) does not.
--
-- The functions on the message path are plpgsql even when one statement would do: plpgsql keeps
-- their plans for the session, while a VOLATILE SQL function (never inlined) is planned again on
-- every call (benchmarks/pgmq_facade.py measured send at 0.78x of native as SQL, 0.99x as plpgsql).
--
-- Payloads: pgmq's jsonb message is stored as its JSON text in UTF-8 with content type
-- application/json, which is what LonnyMQ's JSON serializer writes, so messages interoperate
-- both ways. A message with another content type reads as a JSON string (text/*: the text;
-- anything else: base64). Times: LonnyMQ's epoch milliseconds become timestamptz.
--
-- The schema's comment marks it as this facade ('LonnyMQ pgmq facade over schema <schema>;
-- sha256 <checksum of this file>'): install refuses any other pgmq schema, migrate(pgmq=True)
-- skips an install whose checksum is current, and reinstalling drops and recreates the whole
-- schema (it holds no data; objects of yours that depend on its types go with it). Template:
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
    queue_visible_length bigint
);

-- Helpers ------------------------------------------------------------------------------------

-- A stored payload as pgmq's jsonb message: application/json as JSON, text/* as a JSON string,
-- anything else as a JSON string of its base64. NULL payload gives NULL.
CREATE FUNCTION pgmq._message(p_payload bytea, p_content_type text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN $2 = 'application/json' THEN pg_catalog.convert_from($1, 'UTF8')::jsonb
                WHEN $2 LIKE 'text/%' THEN pg_catalog.to_jsonb(pg_catalog.convert_from($1, 'UTF8'))
                ELSE pg_catalog.to_jsonb(pg_catalog.encode($1, 'base64')) END
$$;

-- Epoch milliseconds as timestamptz (NULL stays NULL).
CREATE FUNCTION pgmq._ts(p_ms bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.to_timestamp($1 / 1000.0)
$$;

-- timestamptz as epoch milliseconds (NULL stays NULL).
CREATE FUNCTION pgmq._ms(p_at timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (extract(epoch FROM $1) * 1000)::bigint
$$;

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

-- Create queue queue_name if it does not exist (pgmq's create is idempotent). A pgmq queue has
-- no attempt limit, so the LonnyMQ queue gets the largest max_attempts; leases default to 30 s
-- but each read gives its own vt.
CREATE FUNCTION pgmq.create_non_partitioned(queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM {schema}.queue_create(queue_name, p_max_attempts => 2147483647, p_if_not_exists => true);
END $$;

CREATE FUNCTION pgmq.create(queue_name text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pgmq.create_non_partitioned($1)
$$;

-- Arguments accepted for compatibility; LonnyMQ's storage is not partitioned per queue.
CREATE FUNCTION pgmq.create_partitioned(
    queue_name         text,
    partition_interval text DEFAULT '10000',
    retention_interval text DEFAULT '100000'
) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pgmq.create_non_partitioned($1)
$$;

CREATE FUNCTION pgmq.create_unlogged(queue_name text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM {schema}.queue_create(queue_name, p_max_attempts => 2147483647, p_unlogged => true,
                                  p_if_not_exists => true);
END $$;

-- Drop queue queue_name with its messages and archive. Returns false if it did not exist.
CREATE FUNCTION pgmq.drop_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT {schema}.queue_drop($1, p_if_exists => true));
END $$;

-- Deprecated in pgmq; the flag is ignored.
CREATE FUNCTION pgmq.drop_queue(queue_name text, partitioned boolean) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT {schema}.queue_drop($1, p_if_exists => true)
$$;

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

-- The one send: messages msgs with headers (NULL or one per message) visible from delay (NULL:
-- now). Returns the new ids in order. Raises LonnyMQ's LQ001 for an unknown queue.
CREATE FUNCTION pgmq.send_batch(
    queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT s.id FROM {schema}.send_batch(
        $1,
        ARRAY(SELECT pg_catalog.convert_to(m::text, 'UTF8') FROM unnest($2) AS m),
        p_content_types => array_fill('application/json'::text, ARRAY[cardinality($2)]),
        p_headers => $3,
        p_at_ms => CASE WHEN $4 IS NOT NULL
                        THEN array_fill(pgmq._ms($4), ARRAY[cardinality($2)]) END
    ) s ORDER BY s.ord;
END $$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[]) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send_batch($1, $2, NULL::jsonb[], NULL::timestamptz);
END $$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[]) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send_batch($1, $2, $3, NULL::timestamptz);
END $$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send_batch($1, $2, NULL::jsonb[], clock_timestamp() + make_interval(secs => $3));
END $$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay timestamptz) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send_batch($1, $2, NULL::jsonb[], $3);
END $$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send_batch($1, $2, $3, clock_timestamp() + make_interval(secs => $4));
END $$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay timestamptz)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send_batch($1, ARRAY[$2], CASE WHEN $3 IS NOT NULL THEN ARRAY[$3] END, $4);
END $$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send($1, $2, NULL::jsonb, NULL::timestamptz);
END $$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send($1, $2, $3, NULL::timestamptz);
END $$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send($1, $2, NULL::jsonb, clock_timestamp() + make_interval(secs => $3));
END $$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, delay timestamptz) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send($1, $2, NULL::jsonb, $3);
END $$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT pgmq.send($1, $2, $3, clock_timestamp() + make_interval(secs => $4));
END $$;

-- Read ---------------------------------------------------------------------------------------

-- Lease up to qty ready messages for vt seconds (LonnyMQ's take; read_ct is the attempt
-- count). conditional (jsonb containment on the message) is not supported yet: any filter
-- other than '{{}}' raises feature_not_supported.
CREATE FUNCTION pgmq.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{{}}')
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF conditional IS NOT NULL AND conditional <> '{{}}'::jsonb THEN
        RAISE EXCEPTION 'pgmq.read: conditional filters are not supported by LonnyMQ''s pgmq facade'
            USING ERRCODE = '0A000';
    END IF;
    RETURN QUERY
    SELECT d.id, d.attempt, pgmq._ts(d.enqueued_at), clock_timestamp(), pgmq._ts(d.lease_until),
           pgmq._message(d.payload, d.content_type), d.headers
      FROM {schema}.take(queue_name, qty, greatest(vt::bigint * 1000, 1)) d;
END $$;

-- read, retried every poll_interval_ms until a message comes or max_poll_seconds pass.
CREATE FUNCTION pgmq.read_with_poll(
    queue_name       text,
    vt               integer,
    qty              integer,
    max_poll_seconds integer DEFAULT 5,
    poll_interval_ms integer DEFAULT 100,
    conditional      jsonb   DEFAULT '{{}}'
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_until timestamptz := clock_timestamp() + make_interval(secs => max_poll_seconds);
BEGIN
    LOOP
        RETURN QUERY SELECT * FROM pgmq.read(queue_name, vt, qty, conditional);
        IF FOUND OR clock_timestamp() >= v_until THEN
            RETURN;
        END IF;
        PERFORM pg_sleep(poll_interval_ms / 1000.0);
    END LOOP;
END $$;

-- Take up to qty ready messages and delete them at once (LonnyMQ's take_tx, not archived).
CREATE FUNCTION pgmq.pop(queue_name text, qty integer DEFAULT 1) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT d.id, d.attempt, pgmq._ts(d.enqueued_at), clock_timestamp(),
           pgmq._ts(coalesce(d.lease_until, d.scheduled_at)), pgmq._message(d.payload, d.content_type),
           d.headers
      FROM {schema}.take_tx($1, $2, p_archive => false) d;
END $$;

-- Settle -------------------------------------------------------------------------------------

-- Delete messages by id, leased or not, without a fencing token (pgmq has none): LonnyMQ's
-- message_cancel. Returns the ids deleted.
CREATE FUNCTION pgmq.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT c FROM {schema}.message_cancel($1, $2, p_archive => false) c;
END $$;

CREATE FUNCTION pgmq.delete(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT EXISTS (SELECT FROM {schema}.message_cancel($1, ARRAY[$2], p_archive => false)));
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

-- Make each of msg_ids visible again at vt: a leased message's lease is extended to vt (vt in
-- the future) or released at once (vt now or past; LonnyMQ's nack with no delay). Returns the messages
-- changed; a message that is not leased (ready or scheduled) is left as it is and not returned.
CREATE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt timestamptz)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_ms     bigint := pgmq._ms(vt) - pgmq._ms(clock_timestamp());
    v_ids    bigint[];
    v_tokens integer[];
BEGIN
    SELECT array_agg(g.id), array_agg(g.token) INTO v_ids, v_tokens
      FROM unnest(msg_ids) AS i(id)
     CROSS JOIN LATERAL {schema}.message_get(queue_name, i.id) g
     WHERE g.status = 'leased';
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    IF v_ms > 0 THEN
        PERFORM {schema}.extend(queue_name, v_ids, v_tokens, v_ms);
    ELSE
        -- The read that leased it stays counted (pgmq's read_ct counts reads); the facade's
        -- queues have no attempt limit, so this never dead-letters them.
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

-- Metrics ------------------------------------------------------------------------------------

-- queue_length counts every live message (ready, scheduled, leased); queue_visible_length the
-- ready ones; total_messages every message ever sent to the queue.
CREATE FUNCTION pgmq.metrics(queue_name text) RETURNS pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT m.queue, m.ready + m.scheduled + m.leased, (m.newest_age_ms / 1000)::integer,
           (m.oldest_age_ms / 1000)::integer, m.total_sent, now(), m.ready
      FROM {schema}.queue_metrics($1) m
$$;

CREATE FUNCTION pgmq.metrics_all() RETURNS SETOF pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT pgmq.metrics(q.name) FROM {schema}.queue_list() q ORDER BY q.name
$$;

-- Privileges: nothing for PUBLIC; EXECUTE for LonnyMQ's roles, whose own grants on {schema}
-- decide what each can actually do through the facade.
DO $grant$
DECLARE
    v_role text;
BEGIN
    REVOKE ALL ON SCHEMA pgmq FROM PUBLIC;
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgmq FROM PUBLIC;
    FOR v_role IN SELECT s.rolname FROM {schema}.security_role s
                   WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = s.rolname) LOOP
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA pgmq TO %I', v_role);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgmq TO %I', v_role);
    END LOOP;
END $grant$;
