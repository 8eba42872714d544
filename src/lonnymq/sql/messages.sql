-- LonnyMQ message-level operations: read one live message without taking it (message_get),
-- browse them (message_list),
-- cancel live messages (message_cancel) and read the archive (archive_list).
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- One live message of queue p_queue by id (p_id) or by key (p_key): exactly one of them.
-- Returns its delivery fields (token = the current fencing token, lease_until only while
-- leased) and status: 'leased' (a lease that has not expired), 'ready' (deliverable now,
-- expired leases included) or 'scheduled'. No row when nothing live matches (settled,
-- cancelled, dead-lettered or unknown). By key: the current version (a leased message that a
-- replace superseded is found by its id only). Raises LQ001, LQ002 (not exactly one of id/key).
-- Reads message (primary key or key index); takes no lock.
CREATE OR REPLACE FUNCTION {schema}.message_get(
    p_queue text,
    p_id    bigint DEFAULT NULL,
    p_key   text   DEFAULT NULL,
    p_now   bigint DEFAULT NULL
) RETURNS TABLE (
    id bigint, attempt integer, token integer, lease_until bigint, scheduled_at bigint,
    enqueued_at bigint, priority smallint, key text, channel text, kind text, content_type text,
    headers jsonb, state jsonb, last_error text, payload bytea, status text
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q     {schema}.queue := {schema}._queue(p_queue);
    v_now bigint := {schema}._read_now(p_now);
BEGIN
    IF (p_id IS NULL) = (p_key IS NULL) THEN
        PERFORM {schema}._invalid('give exactly one of id and key');
    END IF;
    -- Two statements rather than "id = p_id OR key = p_key": each is one index lookup.
    IF p_id IS NOT NULL THEN
        RETURN QUERY
        SELECT m.id, m.attempts, m.deliveries,
               CASE WHEN m.leased AND m.dequeue_at > v_now THEN m.dequeue_at END, m.scheduled_at,
               m.enqueued_at, m.priority, m.key, m.channel, m.kind, m.content_type, m.headers,
               m.state, m.last_error, m.payload,
               CASE WHEN m.leased AND m.dequeue_at > v_now THEN 'leased'
                    WHEN m.dequeue_at <= v_now THEN 'ready' ELSE 'scheduled' END
          FROM {schema}.message m
         WHERE m.queue_id = q.id AND m.id = p_id;
    ELSE
        RETURN QUERY
        SELECT m.id, m.attempts, m.deliveries,
               CASE WHEN m.leased AND m.dequeue_at > v_now THEN m.dequeue_at END, m.scheduled_at,
               m.enqueued_at, m.priority, m.key, m.channel, m.kind, m.content_type, m.headers,
               m.state, m.last_error, m.payload,
               CASE WHEN m.leased AND m.dequeue_at > v_now THEN 'leased'
                    WHEN m.dequeue_at <= v_now THEN 'ready' ELSE 'scheduled' END
          FROM {schema}.message m
         WHERE m.queue_id = q.id AND m.key = p_key AND m.superseded_by IS NULL;
    END IF;
END $$;

-- Cancel live messages of queue p_queue: those with an id in p_ids or a key in p_keys, whether
-- ready, scheduled or leased, are deleted (or moved to the archive with status 'cancelled' when
-- p_archive) and leave their channels. A leased message is removed from under its holder,
-- whose later ack/nack/extend then finds nothing (LeaseLost in the client); it never comes
-- back. A key cancels its current version: a leased version that a replace superseded stays
-- with its holder until settled (cancel it by id). Returns the ids removed, in id order; ids
-- and keys that were not live are left out.
-- Raises LQ001. Writes message, archive, channel, queue_stat (cancelled). Locks: the message
-- rows in id order (waits for a take that holds one, then cancels what it leased), then their
-- channels.
CREATE OR REPLACE FUNCTION {schema}.message_cancel(
    p_queue   text,
    p_ids     bigint[] DEFAULT NULL,
    p_keys    text[]   DEFAULT NULL,
    p_archive boolean  DEFAULT false,
    p_now     bigint   DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q          {schema}.queue := {schema}._queue(p_queue);
    v_now      bigint := {schema}._now(p_now);
    v_ids      bigint[];
    v_channels text[];
    v_leases   integer[];
BEGIN
    -- Lock in id order, like the settling functions, so concurrent cancels and settles cannot
    -- deadlock.
    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids
      FROM (SELECT m.id FROM {schema}.message m
             WHERE m.queue_id = q.id
               AND (m.id = ANY (p_ids) OR (m.key = ANY (p_keys) AND m.superseded_by IS NULL))
             ORDER BY m.id
               FOR UPDATE) x;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    WITH d AS (
        DELETE FROM {schema}.message m WHERE m.queue_id = q.id AND m.id = ANY (v_ids)
        RETURNING m.*
    ), a AS (
        INSERT INTO {schema}.archive (queue_id, id, status, archived_at, scheduled_at, enqueued_at,
                                      attempts, deliveries, priority, key, channel, kind,
                                      content_type, headers, state, last_error, payload)
        SELECT d.queue_id, d.id, 'cancelled', v_now, d.scheduled_at, d.enqueued_at, d.attempts,
               d.deliveries, d.priority, d.key, d.channel, d.kind, d.content_type, d.headers,
               d.state, d.last_error, d.payload
          FROM d WHERE coalesce(p_archive, false)
    ), st AS (
        INSERT INTO {schema}.queue_stat (queue_id, minute, cancelled)
        SELECT q.id, v_now / 60000, count(*) FROM d HAVING count(*) > 0
    )
    SELECT array_agg(d.channel), array_agg(-d.leased::integer) INTO v_channels, v_leases
      FROM d WHERE d.channel IS NOT NULL;
    IF v_channels IS NOT NULL THEN
        PERFORM {schema}._channel_apply(q, v_channels,
            array_fill(-1::bigint, ARRAY[cardinality(v_channels)]), v_leases, v_now);
    END IF;
    RETURN QUERY SELECT unnest(v_ids);
END $$;

-- Archived messages of queue p_queue (acked, dead and cancelled; or only p_status), by id:
-- up to p_limit with id > p_after_id (keyset paging), archived in [p_since, p_until) when
-- either is given (epoch ms). Raises LQ001, LQ002 (bad limit or status). Reads archive: a page
-- is a range scan of its primary key (queue_id, id); with a time window, of archive_status_idx
-- (queue_id, status, archived_at), one range per status.
CREATE OR REPLACE FUNCTION {schema}.archive_list(
    p_queue    text,
    p_after_id bigint  DEFAULT NULL,
    p_since    bigint  DEFAULT NULL,
    p_until    bigint  DEFAULT NULL,
    p_limit    integer DEFAULT 100,
    p_status   text    DEFAULT NULL
) RETURNS TABLE (
    id bigint, status text, archived_at bigint, scheduled_at bigint, enqueued_at bigint,
    attempts integer, deliveries integer, priority smallint, key text, channel text, kind text,
    content_type text, headers jsonb, state jsonb, last_error text, payload bytea
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q          {schema}.queue := {schema}._queue(p_queue);
    v_statuses text[] := ARRAY['acked', 'cancelled', 'dead'];
BEGIN
    PERFORM {schema}._check_limit(p_limit);
    IF p_status IS NOT NULL THEN
        IF p_status <> ALL (v_statuses) THEN
            PERFORM {schema}._invalid(format('status must be acked, cancelled or dead, got %s',
                                             quote_literal(p_status)));
        END IF;
        v_statuses := ARRAY[p_status];
    END IF;
    IF p_since IS NULL AND p_until IS NULL THEN
        RETURN QUERY
        SELECT a.id, a.status, a.archived_at, a.scheduled_at, a.enqueued_at, a.attempts,
               a.deliveries, a.priority, a.key, a.channel, a.kind, a.content_type, a.headers,
               a.state, a.last_error, a.payload
          FROM {schema}.archive a
         WHERE a.queue_id = q.id AND a.id > coalesce(p_after_id, 0) AND a.status = ANY (v_statuses)
         ORDER BY a.id LIMIT p_limit;
    ELSE
        -- Bounds always present (never "p_since IS NULL OR ..."), so they are index conditions
        -- in the generic plan as well.
        RETURN QUERY
        SELECT a.id, a.status, a.archived_at, a.scheduled_at, a.enqueued_at, a.attempts,
               a.deliveries, a.priority, a.key, a.channel, a.kind, a.content_type, a.headers,
               a.state, a.last_error, a.payload
          FROM {schema}.archive a
         WHERE a.queue_id = q.id AND a.status = ANY (v_statuses)
           AND a.archived_at >= coalesce(p_since, -9223372036854775807)
           AND a.archived_at < coalesce(p_until, 9223372036854775807)
           AND a.id > coalesce(p_after_id, 0)
         ORDER BY a.id LIMIT p_limit;
    END IF;
END $$;

-- Browse the live messages of queue p_queue by id (keyset paging): up to p_limit with id >
-- p_after_id, of state p_state ('ready': deliverable now, expired leases included; 'scheduled';
-- 'leased': a lease that has not expired; NULL: all), each with its status as message_get
-- reports it and the payload's size (not the payload: message_get reads one). Raises LQ001,
-- LQ002 (bad limit or state). Reads message: a range scan of its primary key (queue_id, id)
-- from p_after_id, filtered by state (a page of a rare state may read past many others); takes
-- no lock.
CREATE OR REPLACE FUNCTION {schema}.message_list(
    p_queue    text,
    p_state    text    DEFAULT NULL,
    p_after_id bigint  DEFAULT NULL,
    p_limit    integer DEFAULT 100,
    p_now      bigint  DEFAULT NULL
) RETURNS TABLE (
    id bigint, status text, attempt integer, token integer, lease_until bigint,
    scheduled_at bigint, enqueued_at bigint, priority smallint, key text, channel text,
    kind text, content_type text, last_error text, payload_bytes integer
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q     {schema}.queue := {schema}._queue(p_queue);
    v_now bigint := {schema}._read_now(p_now);
BEGIN
    PERFORM {schema}._check_limit(p_limit);
    IF p_state IS NOT NULL AND p_state NOT IN ('ready', 'scheduled', 'leased') THEN
        PERFORM {schema}._invalid(format('state must be ready, scheduled or leased, got %s',
                                         quote_literal(p_state)));
    END IF;
    RETURN QUERY
    SELECT x.id, x.status, x.attempts, x.deliveries,
           CASE WHEN x.status = 'leased' THEN x.dequeue_at END, x.scheduled_at, x.enqueued_at,
           x.priority, x.key, x.channel, x.kind, x.content_type, x.last_error, x.payload_bytes
      FROM (SELECT m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at,
                   m.priority, m.key, m.channel, m.kind, m.content_type, m.last_error,
                   octet_length(m.payload) AS payload_bytes,
                   CASE WHEN m.leased AND m.dequeue_at > v_now THEN 'leased'
                        WHEN m.dequeue_at <= v_now THEN 'ready' ELSE 'scheduled' END AS status
              FROM {schema}.message m
             WHERE m.queue_id = q.id AND m.id > coalesce(p_after_id, 0)
             ORDER BY m.id) x
     WHERE p_state IS NULL OR x.status = p_state
     ORDER BY x.id
     LIMIT p_limit;
END $$;
