-- LonnyMQ for Apache Spark (lonnymq.spark): what the PySpark data source needs in the database.
--
--   * exactly-once writes: tasks COPY rows into spark_stage, tagged with a part id per task
--     attempt; the driver's commit moves the parts its tasks reported into the queue in one
--     transaction (through send_batch, so every send rule applies) and drops the rest.
--   * exactly-once streaming writes: spark_sink_commit remembers (sink, batch) so a micro-batch
--     that Spark replays after a restart is not enqueued twice.
--   * replayable streaming reads: each micro-batch leases its messages with the core take()
--     and records (id, token) in spark_stream_batch, so a replay reads exactly those deliveries
--     and commit acks them. Offsets are batch numbers of this log, never message ids: a message
--     committed late by a slow transaction is simply taken by a later batch.
--
-- Nothing here changes the core tables or the send/take path. Times are epoch ms (bigint);
-- p_now goes through the core's _now(), so only the schema owner may move the clock ahead.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Move the staged parts of a write into p_queue, in one transaction: parts in the given order,
-- rows of a part in staging order, so ids follow the DataFrame's partition order. All staged
-- rows of the run (including those of failed task attempts, which are not in p_parts) are then
-- deleted. With p_sink, the commit happens at most once per (p_sink, p_batch): a batch at or
-- below one already committed for the sink is a replay and enqueues nothing (duplicate = true).
-- Raises LQ101 if a part lost rows (server crash emptied staging, or the sweeper ran).
CREATE OR REPLACE FUNCTION {schema}.spark_write_commit(
    p_queue       text,
    p_run         uuid,
    p_parts       bigint[],
    p_counts      bigint[],
    p_on_conflict text   DEFAULT 'ignore',
    p_sink        text   DEFAULT NULL,
    p_batch       bigint DEFAULT NULL,
    p_now         bigint DEFAULT NULL
) RETURNS TABLE (created bigint, updated bigint, ignored bigint, duplicate boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q          {schema}.queue := {schema}._queue(p_queue);
    v_now      bigint := {schema}._now(p_now);
    -- send_batch per chunk: its per-row cost grows with the batch (channel bookkeeping), and a
    -- few thousand rows per call is where the total is lowest.
    v_chunk    constant integer := 4000;
    v_bad      record;
    v_lo       bigint;
    v_payloads bytea[];
    v_ctypes   text[];
    v_kinds    text[];
    v_keys     text[];
    v_channels text[];
    v_headers  jsonb[];
    v_ats      bigint[];
    v_delays   bigint[];
    v_prios    smallint[];
BEGIN
    created := 0; updated := 0; ignored := 0; duplicate := false;
    IF cardinality(p_parts) IS DISTINCT FROM cardinality(p_counts) THEN
        PERFORM {schema}._invalid('parts and counts must have the same length');
    END IF;
    IF p_sink IS NOT NULL THEN
        IF p_batch IS NULL OR p_batch < 0 THEN
            PERFORM {schema}._invalid('a sink commit needs a batch id >= 0');
        END IF;
        -- One committer per sink at a time; Spark commits a sink's batches in order, so any
        -- committed batch at or above this one means this one is done.
        PERFORM pg_advisory_xact_lock(hashtext({schema_name} || '.spark_sink'), hashtext(p_sink));
        duplicate := EXISTS (SELECT FROM {schema}.spark_sink_commit c
                              WHERE c.sink_id = p_sink AND c.batch_id >= p_batch);
    END IF;

    IF NOT duplicate AND p_parts IS NOT NULL THEN
        SELECT e.part, e.n AS expected, s.n AS found INTO v_bad
          FROM unnest(p_parts, p_counts) AS e(part, n)
          CROSS JOIN LATERAL (SELECT count(*) AS n FROM {schema}.spark_stage st
                               WHERE st.part = e.part) s
         WHERE s.n <> e.n
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'spark write %: part % staged % rows but % are left (staging lost by a server crash or swept): rerun the write',
                p_run, v_bad.part, v_bad.expected, v_bad.found USING ERRCODE = 'LQ101';
        END IF;
        FOR i IN 1 .. cardinality(p_parts) LOOP
            v_lo := 0;
            WHILE v_lo < p_counts[i] LOOP
                SELECT array_agg(s.payload ORDER BY s.seq), array_agg(s.content_type ORDER BY s.seq),
                       array_agg(s.kind ORDER BY s.seq), array_agg(s.key ORDER BY s.seq),
                       array_agg(s.channel ORDER BY s.seq), array_agg(s.headers ORDER BY s.seq),
                       array_agg(s.at_ms ORDER BY s.seq), array_agg(s.delay_ms ORDER BY s.seq),
                       array_agg(coalesce(s.priority, 0::smallint) ORDER BY s.seq)
                  INTO v_payloads, v_ctypes, v_kinds, v_keys, v_channels, v_headers, v_ats,
                       v_delays, v_prios
                  FROM {schema}.spark_stage s
                 WHERE s.part = p_parts[i] AND s.seq >= v_lo AND s.seq < v_lo + v_chunk;
                SELECT created + count(*) FILTER (WHERE b.outcome = 'created'),
                       updated + count(*) FILTER (WHERE b.outcome = 'updated'),
                       ignored + count(*) FILTER (WHERE b.outcome = 'ignored')
                  INTO created, updated, ignored
                  FROM {schema}.send_batch(p_queue => p_queue, p_payloads => v_payloads,
                                           p_kinds => v_kinds, p_content_types => v_ctypes,
                                           p_headers => v_headers, p_at_ms => v_ats,
                                           p_delays_ms => v_delays, p_priorities => v_prios,
                                           p_keys => v_keys, p_channels => v_channels,
                                           p_on_conflict => p_on_conflict, p_now => v_now) b;
                v_lo := v_lo + v_chunk;
            END LOOP;
        END LOOP;
    END IF;

    DELETE FROM {schema}.spark_stage s
     WHERE s.part IN (SELECT p.part FROM {schema}.spark_stage_part p WHERE p.run_id = p_run
                      UNION ALL SELECT unnest(p_parts));
    DELETE FROM {schema}.spark_stage_part p WHERE p.run_id = p_run OR p.part = ANY (p_parts);

    IF p_sink IS NOT NULL AND NOT duplicate THEN
        INSERT INTO {schema}.spark_sink_commit (sink_id, batch_id, queue, messages, committed_at)
        VALUES (p_sink, p_batch, q.name, created + updated, v_now);
        -- Only the newest batches can ever be replayed; keep a short audit trail.
        DELETE FROM {schema}.spark_sink_commit c WHERE c.sink_id = p_sink AND c.batch_id <= p_batch - 100;
    END IF;
    RETURN NEXT;
END $$;

-- Drop what a failed write staged: every part of p_run, plus p_parts. Returns rows deleted.
-- Best effort by nature (a straggling task may stage after it); the sweeper catches the rest.
CREATE OR REPLACE FUNCTION {schema}.spark_write_abort(p_run uuid, p_parts bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_n bigint;
BEGIN
    DELETE FROM {schema}.spark_stage s
     WHERE s.part IN (SELECT p.part FROM {schema}.spark_stage_part p WHERE p.run_id = p_run
                      UNION ALL SELECT unnest(p_parts));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    DELETE FROM {schema}.spark_stage_part p WHERE p.run_id = p_run OR p.part = ANY (p_parts);
    RETURN v_n;
END $$;

-- Raises QueueNotFound (LQ001) unless p_queue exists: lets writers and readers fail at planning.
CREATE OR REPLACE FUNCTION {schema}.spark_queue_check(p_queue text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM {schema}._queue(p_queue);
END $$;

-- Plan micro-batch p_after + 1 of a stream: lease up to p_limit ready messages (NULL: all, at
-- most 1,000,000) with the core take(), p_chunk per call, for p_lease_ms, and log them.
-- p_ready_at bounds what counts as ready (trigger availableNow: the time the run started).
-- Idempotent: if batch p_after + 1 was planned before (the driver died before Spark logged the
-- offset), that batch is returned again. Also renews the leases of the stream's uncommitted
-- batches that are past half their lease. Returns the batch id (p_after when nothing is ready)
-- and its number of messages.
CREATE OR REPLACE FUNCTION {schema}.spark_stream_next(
    p_stream   uuid,
    p_queue    text,
    p_after    bigint,
    p_limit    integer,
    p_chunk    integer DEFAULT 10000,
    p_lease_ms bigint  DEFAULT 600000,
    p_ready_at bigint  DEFAULT NULL,
    p_now      bigint  DEFAULT NULL
) RETURNS TABLE (batch_id bigint, messages bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    bigint := {schema}._now(p_now);
    v_ready  bigint := least(coalesce(p_ready_at, v_now), v_now);
    v_left   integer := least(coalesce(p_limit, 1000000), 1000000);  -- p_limit's type
    v_s      {schema}.spark_stream;
    v_r      record;
    v_ids    bigint[];
    v_tokens integer[];
    v_n      integer;
    v_chunk  integer := 0;
BEGIN
    PERFORM {schema}._queue(p_queue);
    PERFORM {schema}._check_positive(p_lease_ms, 'lease_ms');
    IF p_after IS NULL OR p_after < 0 OR p_limit < 1 OR p_chunk IS NULL OR p_chunk < 1 OR p_chunk > 100000 THEN
        PERFORM {schema}._invalid('invalid stream batch request');
    END IF;
    -- The row lock serialises everything done for one stream.
    INSERT INTO {schema}.spark_stream AS s (stream_id, queue, created_at, seen_at)
    VALUES (p_stream, p_queue, v_now, v_now)
    ON CONFLICT (stream_id) DO UPDATE SET seen_at = v_now
    RETURNING s.* INTO v_s;
    IF v_s.queue <> p_queue THEN
        PERFORM {schema}._invalid(format('this checkpoint reads queue %s, not %s: use a new checkpoint',
                                         quote_literal(v_s.queue), quote_literal(p_queue)));
    END IF;
    IF p_after < v_s.committed_batch THEN
        PERFORM {schema}._invalid(format('stream %s already committed batch %s; offset %s is older (a stale checkpoint?)',
                                         p_stream, v_s.committed_batch, p_after));
    END IF;

    FOR v_r IN SELECT b.chunk, b.ids, b.tokens FROM {schema}.spark_stream_batch b
                WHERE b.stream_id = p_stream AND b.lease_until < v_now + p_lease_ms / 2
                  FOR UPDATE LOOP
        PERFORM {schema}.extend(p_queue => p_queue, p_ids => v_r.ids, p_tokens => v_r.tokens,
                                p_lease_ms => p_lease_ms, p_now => v_now);
    END LOOP;
    UPDATE {schema}.spark_stream_batch b SET lease_until = v_now + p_lease_ms
     WHERE b.stream_id = p_stream AND b.lease_until < v_now + p_lease_ms / 2;

    SELECT sum(cardinality(b.ids)) INTO messages FROM {schema}.spark_stream_batch b
     WHERE b.stream_id = p_stream AND b.batch_id = p_after + 1;
    IF messages IS NOT NULL THEN
        batch_id := p_after + 1;
        RETURN NEXT;
        RETURN;
    END IF;

    messages := 0;
    WHILE v_left > 0 LOOP
        v_n := least(p_chunk, v_left);
        SELECT array_agg(t.id), array_agg(t.token) INTO v_ids, v_tokens
          FROM {schema}.take(p_queue => p_queue, p_limit => v_n,
                             p_lease_ms => p_lease_ms + (v_now - v_ready), p_now => v_ready) t;
        -- take() returns fewer than asked when it dead-letters expired last attempts; only an
        -- empty take means nothing is ready.
        EXIT WHEN v_ids IS NULL;
        INSERT INTO {schema}.spark_stream_batch (stream_id, batch_id, chunk, ids, tokens, lease_until)
        VALUES (p_stream, p_after + 1, v_chunk, v_ids, v_tokens, v_now + p_lease_ms);
        v_chunk := v_chunk + 1;
        messages := messages + cardinality(v_ids);
        v_left := v_left - cardinality(v_ids);
    END LOOP;
    batch_id := CASE WHEN messages > 0 THEN p_after + 1 ELSE p_after END;
    RETURN NEXT;
END $$;

-- The chunks of batches (p_after, p_upto] of a stream, for splitting a micro-batch into tasks.
CREATE OR REPLACE FUNCTION {schema}.spark_stream_chunks(p_stream uuid, p_after bigint, p_upto bigint)
RETURNS TABLE (batch_id bigint, chunk integer, messages integer)
LANGUAGE sql STABLE AS $$
    SELECT b.batch_id, b.chunk, cardinality(b.ids) FROM {schema}.spark_stream_batch b
     WHERE b.stream_id = p_stream AND b.batch_id > p_after AND b.batch_id <= p_upto
     ORDER BY b.batch_id, b.chunk
$$;

-- Spark is done with batches <= p_batch: ack their deliveries (delete, or archive per
-- p_archive / the queue's setting) and forget them. Deliveries whose token went stale (their
-- lease expired and someone else took them) are not touched. Idempotent. Returns the acks.
CREATE OR REPLACE FUNCTION {schema}.spark_stream_commit(
    p_stream  uuid,
    p_batch   bigint,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := {schema}._now(p_now);
    v_s   {schema}.spark_stream;
    v_r   record;
    v_n   bigint := 0::bigint;
    v_k   bigint;
BEGIN
    SELECT * INTO v_s FROM {schema}.spark_stream s WHERE s.stream_id = p_stream FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0::bigint;
    END IF;
    FOR v_r IN DELETE FROM {schema}.spark_stream_batch b
                WHERE b.stream_id = p_stream AND b.batch_id <= p_batch
               RETURNING b.ids, b.tokens LOOP
        SELECT count(*) INTO v_k
          FROM {schema}.ack(p_queue => v_s.queue, p_ids => v_r.ids, p_tokens => v_r.tokens,
                            p_archive => p_archive, p_now => v_now);
        v_n := v_n + v_k;
    END LOOP;
    UPDATE {schema}.spark_stream s
       SET committed_batch = greatest(s.committed_batch, p_batch), seen_at = v_now
     WHERE s.stream_id = p_stream;
    RETURN v_n;
END $$;

-- The deliveries of one chunk of a stream batch that are still this stream's (token matches).
CREATE OR REPLACE FUNCTION {schema}.spark_stream_read(p_stream uuid, p_batch bigint, p_chunk integer)
RETURNS TABLE (queue text, id bigint, status text, payload bytea, content_type text, kind text,
               key text, channel text, headers text, priority smallint, attempts integer,
               deliveries integer, enqueued_at bigint, scheduled_at bigint, dequeue_at bigint,
               archived_at bigint, last_error text, state text)
LANGUAGE sql STABLE AS $$
    SELECT q.name, m.id, 'leased', m.payload, m.content_type, m.kind, m.key, m.channel,
           m.headers::text, m.priority, m.attempts, m.deliveries, m.enqueued_at, m.scheduled_at,
           m.dequeue_at, NULL::bigint, m.last_error, m.state::text
      FROM {schema}.spark_stream_batch b
      JOIN {schema}.spark_stream s ON s.stream_id = b.stream_id
      JOIN {schema}.queue q ON q.name = s.queue
     CROSS JOIN LATERAL unnest(b.ids, b.tokens) WITH ORDINALITY AS t(id, token, ord)
      JOIN {schema}.message m ON m.queue_id = q.id AND m.id = t.id AND m.deliveries = t.token
     WHERE b.stream_id = p_stream AND b.batch_id = p_batch AND b.chunk = p_chunk
     ORDER BY t.ord
$$;

-- The id range [lo, hi] of a queue's live messages ('messages') or archive ('archive', 'dead').
CREATE OR REPLACE FUNCTION {schema}.spark_id_range(p_queue text, p_table text)
RETURNS TABLE (lo bigint, hi bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q {schema}.queue := {schema}._queue(p_queue);
BEGIN
    IF p_table = 'messages' THEN
        RETURN QUERY SELECT min(m.id), max(m.id) FROM {schema}.message m WHERE m.queue_id = q.id;
    ELSIF p_table IN ('archive', 'dead') THEN
        RETURN QUERY SELECT min(a.id), max(a.id) FROM {schema}.archive a WHERE a.queue_id = q.id;
    ELSE
        PERFORM {schema}._invalid('table must be messages, archive or dead');
    END IF;
END $$;

-- Live messages of a queue with p_lo <= id < p_hi, without leasing them. status is judged at
-- p_now, else when the statement started (one instant for every row, and STABLE: now_ms() is
-- VOLATILE and would move while a cursor streams the rows).
CREATE OR REPLACE FUNCTION {schema}.spark_read_messages(p_queue text, p_lo bigint, p_hi bigint, p_now bigint DEFAULT NULL)
RETURNS TABLE (queue text, id bigint, status text, payload bytea, content_type text, kind text,
               key text, channel text, headers text, priority smallint, attempts integer,
               deliveries integer, enqueued_at bigint, scheduled_at bigint, dequeue_at bigint,
               archived_at bigint, last_error text, state text)
LANGUAGE sql STABLE AS $$
    SELECT q.name, m.id,
           CASE WHEN m.dequeue_at <= coalesce(p_now, (extract(epoch FROM statement_timestamp()) * 1000)::bigint)
                THEN 'ready'
                WHEN m.leased THEN 'leased' ELSE 'scheduled' END,
           m.payload, m.content_type, m.kind, m.key, m.channel, m.headers::text, m.priority,
           m.attempts, m.deliveries, m.enqueued_at, m.scheduled_at, m.dequeue_at, NULL::bigint,
           m.last_error, m.state::text
      FROM {schema}.queue q
      JOIN {schema}.message m ON m.queue_id = q.id
     WHERE q.name = p_queue AND m.id >= p_lo AND m.id < p_hi
$$;

-- Archived messages of a queue with p_lo <= id < p_hi: all, or one status ('acked', 'dead').
CREATE OR REPLACE FUNCTION {schema}.spark_read_archive(p_queue text, p_lo bigint, p_hi bigint, p_status text DEFAULT NULL)
RETURNS TABLE (queue text, id bigint, status text, payload bytea, content_type text, kind text,
               key text, channel text, headers text, priority smallint, attempts integer,
               deliveries integer, enqueued_at bigint, scheduled_at bigint, dequeue_at bigint,
               archived_at bigint, last_error text, state text)
LANGUAGE sql STABLE AS $$
    SELECT q.name, a.id, a.status, a.payload, a.content_type, a.kind, a.key, a.channel,
           a.headers::text, a.priority, a.attempts, a.deliveries, a.enqueued_at, a.scheduled_at,
           NULL::bigint, a.archived_at, a.last_error, a.state::text
      FROM {schema}.queue q
      JOIN {schema}.archive a ON a.queue_id = q.id
     WHERE q.name = p_queue AND a.id >= p_lo AND a.id < p_hi
       AND (p_status IS NULL OR a.status = p_status)
$$;

-- Delete staging left by writes that never committed or aborted (driver crash, straggling
-- tasks) once older than p_stage_ttl_ms, and streams not seen for p_stream_ttl_ms with their
-- logs (the leases of their deliveries expire on their own). Returns what was deleted.
CREATE OR REPLACE FUNCTION {schema}.spark_sweep(
    p_stage_ttl_ms  bigint DEFAULT 86400000,
    p_stream_ttl_ms bigint DEFAULT 604800000,
    p_now           bigint DEFAULT NULL
) RETURNS TABLE (staged_rows bigint, streams bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := {schema}._now(p_now);
BEGIN
    IF p_stage_ttl_ms IS NULL OR p_stage_ttl_ms < 0 OR p_stream_ttl_ms IS NULL OR p_stream_ttl_ms < 0 THEN
        PERFORM {schema}._invalid('ttl must be >= 0');
    END IF;
    WITH old AS (
        DELETE FROM {schema}.spark_stage_part p WHERE p.staged_at < v_now - p_stage_ttl_ms
        RETURNING p.part
    ), d AS (
        DELETE FROM {schema}.spark_stage s USING old WHERE s.part = old.part RETURNING 1
    )
    SELECT count(*) INTO staged_rows FROM d;
    DELETE FROM {schema}.spark_stream s WHERE s.seen_at < v_now - p_stream_ttl_ms;
    GET DIAGNOSTICS streams = ROW_COUNT;
    RETURN NEXT;
END $$;
