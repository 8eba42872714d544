-- LonnyMQ dead letters: moving a message that used up its attempts to the dead-letter queue
-- or the archive, and listing, requeueing and purging dead messages.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Moves messages that exhausted max_attempts (or are given up) to the dead-letter queue if the
-- queue has one (counted as sent there), else to the archive with status 'dead'. Writes
-- message, archive, channel, queue_stat (dead; sent for the dead-letter queue: its total_sent).
-- Locks: the message rows (the callers hold them already: each is found by its key and deleted
-- by its ctid, as _deliver does), then their channels.
CREATE OR REPLACE FUNCTION {schema}._dead_letter(q {schema}.queue, p_ids bigint[], p_errors text[], p_now bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_channels text[];
    v_leases   integer[];
    v_dlq      {schema}.queue;
BEGIN
    IF q.dead_letter_queue_id IS NOT NULL THEN
        WITH d AS (
            DELETE FROM {schema}.message m
             USING (SELECT e.error, k.tid
                      FROM unnest(p_ids, p_errors) AS e(id, error)
                     CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM {schema}.message x
                                          WHERE x.queue_id = q.id AND x.id = e.id OFFSET 0) k) e
             WHERE m.ctid = e.tid AND (m.queue_id = q.id) IS TRUE
            RETURNING m.*, e.error
        ), i AS (
        INSERT INTO {schema}.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, priority,
                                      channel, kind, content_type, headers, state, last_error, payload)
        SELECT q.dead_letter_queue_id, {schema}._gen_write(), p_now, p_now, p_now, 0, d.channel, d.kind, d.content_type,
               coalesce(d.headers, '{{}}'::jsonb) || jsonb_build_object('lonnymq_dead_letter',
                   jsonb_build_object('queue', q.name, 'id', d.id, 'key', d.key,
                                      'attempts', d.attempts, 'error', coalesce(d.error, d.last_error),
                                      'enqueued_at', d.enqueued_at)),
               d.state, coalesce(d.error, d.last_error), d.payload
          FROM d ORDER BY d.id
        ), st AS (
            -- They are sent to the dead-letter queue (its total_sent).
            INSERT INTO {schema}.queue_stat (queue_id, minute, sent, dead)
            SELECT x.queue_id, p_now / 60000, x.sent, x.dead
              FROM (SELECT count(*) AS n FROM d) c
             CROSS JOIN LATERAL (VALUES (q.id, 0::bigint, c.n),
                                        (q.dead_letter_queue_id, c.n, 0::bigint)) AS x(queue_id, sent, dead)
             WHERE c.n > 0
        )
        SELECT array_agg(d.channel), array_agg(-d.leased::integer) INTO v_channels, v_leases
          FROM d WHERE d.channel IS NOT NULL;
        PERFORM {schema}._wake(q.dead_letter_queue_id,
                               (SELECT name FROM {schema}.queue WHERE id = q.dead_letter_queue_id));
    ELSE
        WITH d AS (
            DELETE FROM {schema}.message m
             USING (SELECT e.error, k.tid
                      FROM unnest(p_ids, p_errors) AS e(id, error)
                     CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM {schema}.message x
                                          WHERE x.queue_id = q.id AND x.id = e.id OFFSET 0) k) e
             WHERE m.ctid = e.tid AND (m.queue_id = q.id) IS TRUE
            RETURNING m.*, e.error
        ), a AS (
        INSERT INTO {schema}.archive (queue_id, id, status, archived_at, scheduled_at, enqueued_at,
                                      attempts, deliveries, priority, key, channel, kind,
                                      content_type, headers, state, last_error, payload)
        SELECT d.queue_id, d.id, 'dead', p_now, d.scheduled_at, d.enqueued_at, d.attempts,
               d.deliveries, d.priority, d.key, d.channel, d.kind, d.content_type, d.headers,
               d.state, coalesce(d.error, d.last_error), d.payload
          FROM d
        ), st AS (
            INSERT INTO {schema}.queue_stat (queue_id, minute, dead)
            SELECT q.id, p_now / 60000, count(*) FROM d HAVING count(*) > 0
        )
        SELECT array_agg(d.channel), array_agg(-d.leased::integer) INTO v_channels, v_leases
          FROM d WHERE d.channel IS NOT NULL;
    END IF;
    -- The messages leave their channels; in a dead-letter queue they keep their channel.
    IF v_channels IS NOT NULL THEN
        PERFORM {schema}._channel_apply(q, v_channels,
            array_fill(-1::bigint, ARRAY[cardinality(v_channels)]), v_leases, p_now);
        IF q.dead_letter_queue_id IS NOT NULL THEN
            PERFORM {schema}._channel_enable(q.dead_letter_queue_id);
            SELECT * INTO v_dlq FROM {schema}.queue WHERE id = q.dead_letter_queue_id;
            PERFORM {schema}._channel_apply(v_dlq, v_channels,
                array_fill(1::bigint, ARRAY[cardinality(v_channels)]),
                array_fill(0, ARRAY[cardinality(v_channels)]), p_now);
        END IF;
    END IF;
END $$;

-- Up to p_limit dead messages of queue p_queue with id > p_after_id, by id (keyset paging),
-- archived in [p_since, p_until) when given (epoch ms). The rows of archive_list with status
-- 'dead'. Raises LQ001, LQ002 (bad limit). Reads archive (index scans, see archive_list).
CREATE OR REPLACE FUNCTION {schema}.dead_list(
    p_queue    text,
    p_limit    integer DEFAULT 100,
    p_after_id bigint  DEFAULT 0,
    p_since    bigint  DEFAULT NULL,
    p_until    bigint  DEFAULT NULL
) RETURNS TABLE (id bigint, archived_at bigint, attempts integer, kind text, key text,
                 last_error text, headers jsonb, content_type text, payload bytea)
LANGUAGE sql STABLE AS $$
    SELECT a.id, a.archived_at, a.attempts, a.kind, a.key, a.last_error, a.headers,
           a.content_type, a.payload
      FROM {schema}.archive_list(p_queue, p_after_id, p_since, p_until, p_limit, 'dead') a
$$;

-- Put dead messages (all, or the given ids) back into their queue as new, ready messages with
-- a fresh attempt budget (counted as sent: queue_stat). Returns how many were
-- requeued.
CREATE OR REPLACE FUNCTION {schema}.dead_requeue(p_queue text, p_ids bigint[] DEFAULT NULL, p_now bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q     {schema}.queue := {schema}._queue(p_queue);
    v_now bigint := {schema}._now(p_now);
    v_n   bigint;
    v_channels text[];
BEGIN
    WITH d AS (
        DELETE FROM {schema}.archive a
         WHERE a.queue_id = q.id AND a.status = 'dead' AND (p_ids IS NULL OR a.id = ANY (p_ids))
        RETURNING a.*
    ), i AS (
        INSERT INTO {schema}.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, priority,
                                      channel, kind, content_type, headers, state, last_error, payload)
        SELECT q.id, {schema}._gen_write(), v_now, v_now, v_now, d.priority, d.channel, d.kind, d.content_type, d.headers,
               d.state, d.last_error, d.payload
          FROM d ORDER BY d.id
        RETURNING channel
    ), st AS (
        INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
        SELECT q.id, v_now / 60000, count(*) FROM i HAVING count(*) > 0
    )
    SELECT count(*), array_agg(i.channel) FILTER (WHERE i.channel IS NOT NULL)
      INTO v_n, v_channels FROM i;
    IF v_channels IS NOT NULL THEN
        PERFORM {schema}._channel_enable(q.id);
        PERFORM {schema}._channel_apply(q, v_channels,
            array_fill(1::bigint, ARRAY[cardinality(v_channels)]),
            array_fill(0, ARRAY[cardinality(v_channels)]), v_now);
    END IF;
    IF v_n > 0 THEN
        PERFORM {schema}._wake(q.id, q.name);
    END IF;
    RETURN v_n;
END $$;

-- Delete every dead message of queue p_queue. Returns how many. Writes archive.
CREATE OR REPLACE FUNCTION {schema}.dead_purge(p_queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q   {schema}.queue := {schema}._queue(p_queue);
    v_n bigint;
BEGIN
    DELETE FROM {schema}.archive a WHERE a.queue_id = q.id AND a.status = 'dead';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;
