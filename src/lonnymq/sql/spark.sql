-- LonnyMQ for Apache Spark (lonnymq.spark): what the PySpark data source needs in the database.
--
--   * exactly-once writes: tasks COPY rows into spark_stage, tagged with a part id per task
--     attempt; the driver's commit moves the parts its tasks reported into the queue in one
--     transaction, with every send rule, and drops the rest: set-wise (_spark_publish, one
--     INSERT ... SELECT per part) when no row has a key or a channel, through send_batch when
--     one does.
--   * exactly-once streaming writes: spark_sink_commit remembers (sink, batch) so a micro-batch
--     that Spark replays after a restart is not enqueued twice.
--   * replayable streaming reads: each micro-batch leases its messages with the core take()
--     and records (id, token) in spark_stream_batch, so a replay reads exactly those deliveries
--     and commit acks them. Offsets are batch numbers of this log, never message ids: a message
--     committed late by a slow transaction is simply taken by a later batch.
--   * reads at wire speed: spark_read_packed and spark_stream_read_packed return pages of rows
--     packed column by column (_spark_pack_sql), which the reader turns into Arrow arrays
--     without a Python object per row.
--
-- Nothing here changes the core tables or the send/take path. Times are epoch ms (bigint);
-- p_now goes through the core's _now(), so only the schema owner may move the clock ahead.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Signatures that changed (0.2: write ids per queue with a retention, filter pushdown). The
-- file is re-applied whenever it changes; CREATE OR REPLACE cannot change a result type or
-- drop a parameter, so the old versions go first (no-ops on a fresh install).
DROP FUNCTION IF EXISTS {schema}.spark_write_commit(text, uuid, bigint[], bigint[], text, text, bigint, bigint);
DROP FUNCTION IF EXISTS {schema}.spark_read_messages(text, bigint, bigint, bigint);
DROP FUNCTION IF EXISTS {schema}.spark_read_archive(text, bigint, bigint, text);
-- 0.2, issue 20: the writer gives the content type once per write (p_content_type).
DROP FUNCTION IF EXISTS {schema}.spark_write_commit(text, uuid, bigint[], bigint[], text, text, bigint, bigint, bigint);
DROP FUNCTION IF EXISTS {schema}._spark_publish({schema}.queue, uuid, bigint[], bigint[], bigint);

-- Move the staged parts of a write into p_queue, in one transaction: parts in the given order,
-- rows of a part in staging order, so ids follow the DataFrame's partition order. All staged
-- rows of the run (including those of failed task attempts, which are not in p_parts) are then
-- dropped (_spark_unstage: staging is truncated when it holds nothing else). With p_sink (a write id or a streaming sink), the commit happens at most once per
-- (p_queue, p_sink, p_batch): a batch at or below one already committed for the sink on this
-- queue is a replay and enqueues nothing (duplicate = true; the record's skipped count goes
-- up, and committed_at / messages describe the commit that made it a replay). A record counts
-- for p_retention_ms after its commit; an expired one is forgotten (as maintain() would).
-- Every send rule applies: rows without key and channel are published set-wise by
-- _spark_publish (the plain path of send_batch, one INSERT ... SELECT per part); if any row has
-- one, the parts go through send_batch itself, 4,000 rows per call.
-- p_content_type is the content type of every staged row that has none: the writer gives it
-- once per write here rather than staging it with every row (a row's own wins).
-- Raises LQ101 if a part lost rows (server crash emptied staging, or the sweeper ran), and
-- send_batch's error for a row that breaks a send rule; either way nothing is enqueued.
-- Tables: spark_stage, spark_stage_part (delete), spark_sink_commit (insert/update/delete),
-- and the queue as send_batch (message, queue_stat, channel). Locks: an advisory
-- transaction lock per (queue, sink), send_batch's, and spark_stage ACCESS EXCLUSIVE when
-- _spark_unstage gets it without waiting. Plans pinned to indexes (staging is
-- never analysed; a sort or a scan of all of it would cost more than the publish), and no JIT:
-- with sequential scans off, a tiny table's only plan (message_gen_seq in _gen_write) costs
-- 1e10 and was JIT-compiled, inlined and optimised on every commit (45 ms of a 1 s commit).
CREATE OR REPLACE FUNCTION {schema}.spark_write_commit(
    p_queue        text,
    p_run          uuid,
    p_parts        bigint[],
    p_counts       bigint[],
    p_on_conflict  text   DEFAULT 'ignore',
    p_sink         text   DEFAULT NULL,
    p_batch        bigint DEFAULT NULL,
    p_retention_ms bigint DEFAULT 604800000,
    p_now          bigint DEFAULT NULL,
    p_content_type text   DEFAULT NULL
) RETURNS TABLE (created bigint, updated bigint, ignored bigint, duplicate boolean,
                 committed_at bigint, messages bigint)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
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
    IF p_on_conflict IS NULL OR p_on_conflict NOT IN ('ignore', 'replace', 'error') THEN
        PERFORM {schema}._invalid('on_conflict must be ignore, replace or error');
    END IF;
    IF p_sink IS NOT NULL THEN
        IF p_batch IS NULL OR p_batch < 0 THEN
            PERFORM {schema}._invalid('a sink commit needs a batch id >= 0');
        END IF;
        PERFORM {schema}._check_positive(p_retention_ms, 'retention_ms');
        -- One committer per (queue, sink) at a time; Spark commits a sink's batches in order,
        -- so any committed batch at or above this one means this one is done.
        PERFORM pg_advisory_xact_lock(hashtext({schema_name} || '.spark_sink'), hashtext(q.name || '/' || p_sink));
        DELETE FROM {schema}.spark_sink_commit c
         WHERE c.queue = q.name AND c.sink_id = p_sink AND c.expires_at <= v_now;
        UPDATE {schema}.spark_sink_commit c
           SET skipped = c.skipped + 1, last_skipped_at = v_now
         WHERE c.queue = q.name AND c.sink_id = p_sink
           AND c.batch_id = (SELECT max(d.batch_id) FROM {schema}.spark_sink_commit d
                              WHERE d.queue = q.name AND d.sink_id = p_sink AND d.batch_id >= p_batch)
        RETURNING c.committed_at, c.messages INTO committed_at, messages;
        duplicate := FOUND;
    END IF;

    IF NOT duplicate AND cardinality(p_parts) > 0
       AND NOT EXISTS (SELECT FROM {schema}.spark_stage s
                        WHERE s.part = ANY (p_parts) AND (s.key IS NOT NULL OR s.channel IS NOT NULL)) THEN
        -- One probe of spark_stage_keyed_idx (which holds only rows with a key or a channel).
        created := {schema}._spark_publish(q, p_run, p_parts, p_counts, v_now, p_content_type);
    ELSIF NOT duplicate AND cardinality(p_parts) > 0 THEN
        SELECT e.part, e.n AS expected, s.n AS found INTO v_bad
          FROM unnest(p_parts, p_counts) AS e(part, n)
          CROSS JOIN LATERAL (SELECT count(*) AS n FROM {schema}.spark_stage st
                               WHERE st.part = e.part) s
         WHERE s.n <> e.n
         LIMIT 1;
        IF FOUND THEN
            PERFORM {schema}._spark_lost(p_run, v_bad.part, v_bad.expected, v_bad.found);
        END IF;
        FOR i IN 1 .. cardinality(p_parts) LOOP
            v_lo := 0;
            WHILE v_lo < p_counts[i] LOOP
                SELECT array_agg(s.payload ORDER BY s.seq),
                       array_agg(coalesce(s.content_type, p_content_type) ORDER BY s.seq),
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

    PERFORM {schema}._spark_unstage(p_run, p_parts);

    IF NOT duplicate THEN
        committed_at := v_now;
        messages := created + updated;
    END IF;
    IF p_sink IS NOT NULL AND NOT duplicate THEN
        INSERT INTO {schema}.spark_sink_commit (sink_id, batch_id, queue, messages, committed_at, expires_at)
        VALUES (p_sink, p_batch, q.name, messages, v_now, v_now + p_retention_ms);
        -- Only the newest batches can ever be replayed; keep a short audit trail.
        DELETE FROM {schema}.spark_sink_commit c
         WHERE c.queue = q.name AND c.sink_id = p_sink AND c.batch_id <= p_batch - 100;
    END IF;
    RETURN NEXT;
END $$;

-- Delete the part records of write p_run (every part of p_run, plus p_parts) and the rows of
-- exactly the parts deleted, in one statement: one snapshot, so a straggling task of the same
-- write that commits meanwhile (its part record and its rows are one transaction) keeps both
-- or loses both. Two statements would see it only in the second and delete its record but not
-- its rows: rows no sweep could find again. Returns the rows deleted.
-- Tables: spark_stage_part, spark_stage (delete).
CREATE OR REPLACE FUNCTION {schema}._spark_drop_staged(p_run uuid, p_parts bigint[]) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    WITH gone AS (
        DELETE FROM {schema}.spark_stage_part p WHERE p.run_id = p_run OR p.part = ANY (p_parts)
        RETURNING p.part
    ), d AS (
        DELETE FROM {schema}.spark_stage s
         WHERE s.part IN (SELECT g.part FROM gone g UNION ALL SELECT unnest(p_parts))
        RETURNING 1
    )
    SELECT count(*) FROM d
$$;

-- Drop what write p_run staged (every part of p_run, plus p_parts) and its part records, for
-- spark_write_commit. When staging holds nothing else (one write at a time: the usual case) it
-- is TRUNCATEd: a few file operations, where a DELETE marks every staged row (0.19 s of a
-- 200,000-row commit). The ACCESS EXCLUSIVE lock that needs is only tried (NOWAIT): a task
-- staging, a commit or an abort of another write holds a lock on spark_stage, and then the rows
-- are deleted as before. The check runs under the lock, so nothing can stage while it runs:
-- every staged row's part is registered in spark_stage_part by the transaction that staged it,
-- so a part table that registers no other write's part means staging holds only this write's
-- rows (a task that registered its part but has not begun its COPY waits for the lock and
-- stages after the truncate). The lock is held to the end of the caller's transaction.
-- With the transaction-local setting lonnymq.spark_unstage = 'delete' (the Spark writer's
-- two-phase commit, spark/_write.py: a transaction prepared for it keeps its locks until it is
-- resolved, and a prepared TRUNCATE's lock would stop every write staging on the server,
-- the rerun that resolves it among them) it always deletes.
-- Tables: spark_stage (truncate or delete), spark_stage_part (delete). Locks: spark_stage
-- ACCESS EXCLUSIVE (tried, never waited for).
CREATE OR REPLACE FUNCTION {schema}._spark_unstage(p_run uuid, p_parts bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_alone boolean := false;
BEGIN
    IF current_setting('lonnymq.spark_unstage', true) = 'delete' THEN
        PERFORM {schema}._spark_drop_staged(p_run, p_parts);
        RETURN;
    END IF;
    BEGIN
        LOCK TABLE {schema}.spark_stage IN ACCESS EXCLUSIVE MODE NOWAIT;
        -- A NULL run or part counts as another write's (never truncate on a guess).
        v_alone := NOT EXISTS (SELECT FROM {schema}.spark_stage_part p
                                WHERE p.run_id IS DISTINCT FROM p_run AND (p.part = ANY (p_parts)) IS NOT TRUE);
    EXCEPTION WHEN lock_not_available THEN
        v_alone := false;
    END;
    IF v_alone THEN
        TRUNCATE {schema}.spark_stage;
        DELETE FROM {schema}.spark_stage_part p WHERE p.run_id = p_run OR p.part = ANY (p_parts);
    ELSE
        PERFORM {schema}._spark_drop_staged(p_run, p_parts);
    END IF;
END $$;

-- Raises LQ101 for part p_part of write p_run, which staged p_expected rows of which p_found
-- are left (a server crash emptied the unlogged staging, or the sweeper ran). STABLE, not
-- IMMUTABLE, for the reason _invalid gives (sql/util.sql).
CREATE OR REPLACE FUNCTION {schema}._spark_lost(p_run uuid, p_part bigint, p_expected bigint, p_found bigint)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
-- plpgsql_check suggests IMMUTABLE; STABLE is intended, see above.
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    RAISE EXCEPTION 'spark write %: part % staged % rows but % are left (staging lost by a server crash or swept): rerun the write',
        p_run, p_part, p_expected, p_found USING ERRCODE = 'LQ101';
END $$;

-- The set-wise publish of spark_write_commit, for parts none of whose rows has a key or a
-- channel (the caller checked): send_batch's plain path, without building arrays. Each part
-- p_parts[i] is one INSERT ... SELECT from staging in seq order (the (part, seq) index: no
-- sort), so ids follow the parts' order and their rows'. Every row is checked as send_batch
-- checks it (payload size against the queue's limit, priority in -100..100, delay >= 0,
-- headers an object) inside that INSERT, which leaves out a row that fails; a part that then
-- moved fewer rows than p_counts[i] raises, and the caller's transaction enqueues nothing:
-- LQ101 (_spark_lost) if rows are missing, else send_batch's error for the first bad row (its
-- "message N" counts rows across the parts, from 1). A row without a content type gets
-- p_content_type. One enqueue time p_now and one generation
-- (_gen_write) for all; the queue's waiters are woken (_wake); the messages count in
-- queue_stat (one row). Returns the messages created. Writes message,
-- queue_stat. Locks: _gen_write's shared advisory lock, _wake's.
CREATE OR REPLACE FUNCTION {schema}._spark_publish(
    q              {schema}.queue,
    p_run          uuid,
    p_parts        bigint[],
    p_counts       bigint[],
    p_now          bigint,
    p_content_type text
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_gen   bigint;
    v_n     bigint;
    v_total bigint := 0::bigint;
    v_bad   record;
    v_ord   bigint;
BEGIN
    PERFORM {schema}._wake(q.id, q.name);
    v_gen := {schema}._gen_write();
    FOR i IN 1 .. cardinality(p_parts) LOOP
        INSERT INTO {schema}.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                          priority, kind, content_type, headers, payload)
        SELECT q.id, v_gen, {schema}._dequeue_at(t.at, t.priority, q.priority_step_ms, p_now), t.at,
               p_now, t.priority, t.kind, t.content_type, t.headers, t.payload
          FROM (SELECT coalesce(s.at_ms, p_now + coalesce(s.delay_ms, 0)) AS at,
                       coalesce(s.priority, 0::smallint) AS priority, s.kind,
                       coalesce(s.content_type, p_content_type) AS content_type,
                       s.headers, s.payload, s.seq
                  FROM {schema}.spark_stage s
                 WHERE s.part = p_parts[i]
                   AND octet_length(s.payload) <= q.max_payload_bytes
                   AND (s.priority IS NULL OR s.priority BETWEEN -100 AND 100)
                   AND (s.delay_ms IS NULL OR s.delay_ms >= 0)
                   AND (s.headers IS NULL OR jsonb_typeof(s.headers) = 'object')) t
         ORDER BY t.seq;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n <> p_counts[i] THEN
            SELECT count(*) INTO v_n FROM {schema}.spark_stage s WHERE s.part = p_parts[i];
            IF v_n <> p_counts[i] THEN
                PERFORM {schema}._spark_lost(p_run, p_parts[i], p_counts[i], v_n);
            END IF;
            SELECT s.seq, octet_length(s.payload) AS size, s.priority, s.delay_ms,
                   s.headers IS NOT NULL AND jsonb_typeof(s.headers) <> 'object' AS badh
              INTO v_bad
              FROM {schema}.spark_stage s
             WHERE s.part = p_parts[i]
               AND (octet_length(s.payload) > q.max_payload_bytes OR s.priority NOT BETWEEN -100 AND 100
                    OR s.delay_ms < 0 OR jsonb_typeof(s.headers) <> 'object')
             ORDER BY s.seq
             LIMIT 1;
            SELECT v_total + count(*) INTO v_ord
              FROM {schema}.spark_stage s WHERE s.part = p_parts[i] AND s.seq <= v_bad.seq;
            IF v_bad.size > q.max_payload_bytes THEN
                RAISE EXCEPTION 'message % payload is % bytes; queue % allows at most %', v_ord,
                    v_bad.size, quote_literal(q.name), q.max_payload_bytes USING ERRCODE = 'LQ003';
            ELSIF v_bad.badh THEN
                PERFORM {schema}._invalid(format('message %s headers must be a JSON object', v_ord));
            ELSIF v_bad.delay_ms < 0 THEN
                PERFORM {schema}._invalid(format('message %s delay must be >= 0', v_ord));
            ELSE
                PERFORM {schema}._invalid(format('message %s priority %s is outside -100..100',
                                                 v_ord, v_bad.priority));
            END IF;
        END IF;
        v_total := v_total + v_n;
    END LOOP;
    IF v_total > 0 THEN
        INSERT INTO {schema}.queue_stat (queue_id, minute, sent) VALUES (q.id, p_now / 60000, v_total);
    END IF;
    RETURN v_total;
END $$;

-- Drop what a failed write staged: every part of p_run, plus p_parts. Returns rows deleted.
-- Best effort by nature (a straggling task may stage after it); the sweeper catches the rest.
CREATE OR REPLACE FUNCTION {schema}.spark_write_abort(p_run uuid, p_parts bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN {schema}._spark_drop_staged(p_run, p_parts);
END $$;

-- Raises QueueNotFound (LQ001) unless p_queue exists: lets writers and readers fail at planning.
CREATE OR REPLACE FUNCTION {schema}.spark_queue_check(p_queue text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM {schema}._queue(p_queue);
END $$;

-- Plan micro-batch p_after + 1 of a stream: lease up to p_limit ready messages (NULL: all, at
-- most 1,000,000), p_chunk per statement, for p_lease_ms, and log them. p_ready_at bounds what
-- counts as ready (trigger availableNow: the time the run started). Idempotent: if batch
-- p_after + 1 was planned before (the driver died before Spark logged the offset), that batch
-- is returned again. Also renews the leases of the stream's uncommitted batches that are past
-- half their lease. Returns the batch id (p_after when nothing is ready) and its number of
-- messages.
-- The leases are take()'s, in take()'s order, set-wise: a plain queue's candidates are locked by
-- take()'s own candidate query (_lock_ready, which also dead-letters messages whose lease
-- expired on their last attempt) and leased by one UPDATE per chunk that returns only (id,
-- token), where take() would return every column of every message (payloads included) through
-- two nested functions; a queue with channels goes through take() itself (its round robin and
-- concurrency bookkeeping), and a paused queue leases nothing. Plans pinned as take()'s (see
-- settle.sql's header): no sequential scan, no sort where an index gives the order, no JIT.
-- Writes spark_stream, spark_stream_batch, message (and what take() writes). Locks: the stream's
-- row (serialises everything done for one stream), the rows it leases (FOR UPDATE SKIP LOCKED).
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
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
DECLARE
    q        {schema}.queue := {schema}._queue(p_queue);
    v_now    bigint := {schema}._now(p_now);
    v_ready  bigint := least(coalesce(p_ready_at, v_now), v_now);
    v_left   integer := least(coalesce(p_limit, 1000000), 1000000);  -- p_limit's type
    v_s      {schema}.spark_stream;
    v_r      record;
    v_ids    bigint[];
    v_tokens integer[];
    v_n      integer;
    v_chunk  integer := 0;
    v_locked bigint[];
    v_dead   bigint[];
BEGIN
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
    WHILE v_left > 0 AND NOT q.paused LOOP
        v_n := least(p_chunk, v_left);
        IF q.uses_channels THEN
            -- take() at v_ready (only what was ready then), leased until v_now + p_lease_ms.
            SELECT array_agg(t.id), array_agg(t.token) INTO v_ids, v_tokens
              FROM {schema}.take(p_queue => p_queue, p_limit => v_n,
                                 p_lease_ms => p_lease_ms + (v_now - v_ready), p_now => v_ready) t;
            -- take() returns fewer than asked when it dead-letters expired last attempts; only
            -- an empty take means nothing is ready.
            EXIT WHEN v_ids IS NULL;
            INSERT INTO {schema}.spark_stream_batch (stream_id, batch_id, chunk, ids, tokens, lease_until)
            VALUES (p_stream, p_after + 1, v_chunk, v_ids, v_tokens, v_now + p_lease_ms);
            v_chunk := v_chunk + 1;
        ELSE
            -- All at once: each statement that locks candidates reads the dequeue index from
            -- its start, past the entries of every row this transaction leased before it, so
            -- one per chunk would read the batch's entries over and over.
            SELECT r.ids, r.dead INTO v_locked, v_dead FROM {schema}._lock_ready(q, v_left, v_ready) r;
            -- Only dead letters (they left the ready set): look again. Nothing: nothing ready.
            EXIT WHEN v_locked IS NULL AND v_dead IS NULL;
            CONTINUE WHEN v_locked IS NULL;
            -- _deliver's lease (each row found by its key, changed by its ctid), returning the
            -- deliveries only.
            WITH u AS (
                UPDATE {schema}.message m
                   SET dequeue_at = v_now + p_lease_ms, attempts = m.attempts + 1,
                       deliveries = m.deliveries + 1, leased = true
                  FROM (SELECT t.ord, k.tid
                          FROM unnest(v_locked) WITH ORDINALITY AS t(id, ord)
                         CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM {schema}.message x
                                              WHERE x.queue_id = q.id AND x.id = t.id OFFSET 0) k) t
                 WHERE m.ctid = t.tid AND (m.queue_id = q.id) IS TRUE
                RETURNING t.ord, m.id, m.deliveries
            )
            SELECT array_agg(u.id ORDER BY u.ord), array_agg(u.deliveries ORDER BY u.ord)
              INTO v_ids, v_tokens
              FROM u;
            -- Logged in chunks of p_chunk (a chunk is read by one task).
            INSERT INTO {schema}.spark_stream_batch (stream_id, batch_id, chunk, ids, tokens, lease_until)
            SELECT p_stream, p_after + 1, v_chunk + c.i, v_ids[c.i * p_chunk + 1 : (c.i + 1) * p_chunk],
                   v_tokens[c.i * p_chunk + 1 : (c.i + 1) * p_chunk], v_now + p_lease_ms
              FROM generate_series(0, (cardinality(v_ids) - 1) / p_chunk) AS c(i);
            v_chunk := v_chunk + (cardinality(v_ids) - 1) / p_chunk + 1;
        END IF;
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
-- The core _ack (as ack() runs it: rows locked in id order, deleted or archived, remembered in
-- settled, their channels updated) of each logged chunk, without ack()'s look for repeats (the
-- log is deleted in the same transaction, so a batch is acked once). A chunk (10,000 rows) at
-- a time: one _ack of a whole 200,000-row batch ran at a third of the speed (200,000 rows, one
-- process: 19,200 rows/s against a bare DELETE's 55,600; per chunk 40,100 against 36,500).
-- Plans pinned as ack()'s (settle.sql's header). Writes spark_stream, spark_stream_batch, and
-- what _ack writes. Locks: the stream's row, then _ack's.
CREATE OR REPLACE FUNCTION {schema}.spark_stream_commit(
    p_stream  uuid,
    p_batch   bigint,
    p_archive boolean DEFAULT NULL,
    p_now     bigint  DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET jit = off AS $$
DECLARE
    v_now    bigint := {schema}._now(p_now);
    v_s      {schema}.spark_stream;
    q        {schema}.queue;
    v_r      record;
    v_n      bigint := 0::bigint;
BEGIN
    SELECT * INTO v_s FROM {schema}.spark_stream s WHERE s.stream_id = p_stream FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0::bigint;
    END IF;
    FOR v_r IN DELETE FROM {schema}.spark_stream_batch b
                WHERE b.stream_id = p_stream AND b.batch_id <= p_batch
               RETURNING b.ids, b.tokens LOOP
        q := {schema}._queue(v_s.queue);
        SELECT v_n + count(*) INTO v_n
          FROM {schema}._ack(q, v_r.ids, v_r.tokens, coalesce(p_archive, q.archive), v_now) a;
    END LOOP;
    UPDATE {schema}.spark_stream s
       SET committed_batch = greatest(s.committed_batch, p_batch), seen_at = v_now
     WHERE s.stream_id = p_stream;
    RETURN v_n;
END $$;

-- The query behind spark_stream_read and spark_stream_read_packed: the deliveries of chunk $3
-- of batch $2 of stream $1 that are still this stream's (token matches), as the read columns of
-- spark_read_messages, in delivery order; with p_paged also their position in the chunk (ord),
-- only those after $4. The chunk's (id, token, ord) are sorted by ord in a subquery (which the
-- planner keeps: it has an ORDER BY), so the message rows are probed in that order by a nested
-- loop that a page's LIMIT stops: joined first and sorted after, a page of 2,000 rows probed all
-- 10,000 of its chunk and sorted their payloads (a chunk read in 2 pages probed 18,000 rows).
-- Builds constant text: IMMUTABLE.
CREATE OR REPLACE FUNCTION {schema}._spark_stream_sql(p_paged boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'SELECT t.name, m.id, ''leased''::text, m.payload, m.content_type, m.kind, m.key, m.channel,'
        || ' m.headers::text, m.priority, m.attempts, m.deliveries, m.enqueued_at, m.scheduled_at,'
        || ' m.dequeue_at, NULL::bigint, m.last_error, m.state::text'
        || CASE WHEN p_paged THEN ', t.ord' ELSE '' END
        || ' FROM (SELECT q.name, q.id AS queue_id, u.id, u.token, u.ord'
        || ' FROM {schema}.spark_stream_batch b'
        || ' JOIN {schema}.spark_stream s ON s.stream_id = b.stream_id'
        || ' JOIN {schema}.queue q ON q.name = s.queue'
        || ' CROSS JOIN LATERAL unnest(b.ids, b.tokens) WITH ORDINALITY AS u(id, token, ord)'
        || ' WHERE b.stream_id = $1 AND b.batch_id = $2 AND b.chunk = $3'
        || CASE WHEN p_paged THEN ' AND u.ord > $4' ELSE '' END
        || ' ORDER BY u.ord) t'
        || ' JOIN {schema}.message m ON m.queue_id = t.queue_id AND m.id = t.id AND m.deliveries = t.token'
        || ' ORDER BY t.ord'
$$;

-- The deliveries of one chunk of a stream batch that are still this stream's (token matches),
-- in delivery order (_spark_stream_sql). Reads spark_stream_batch, spark_stream, queue, message.
CREATE OR REPLACE FUNCTION {schema}.spark_stream_read(p_stream uuid, p_batch bigint, p_chunk integer)
RETURNS TABLE (queue text, id bigint, status text, payload bytea, content_type text, kind text,
               key text, channel text, headers text, priority smallint, attempts integer,
               deliveries integer, enqueued_at bigint, scheduled_at bigint, dequeue_at bigint,
               archived_at bigint, last_error text, state text)
LANGUAGE plpgsql STABLE AS $$
-- Intended exceptions to plpgsql_check, which cannot see into dynamic SQL: the EXECUTEd text is
-- constant (_spark_stream_sql; the values go through USING), the OUT columns are filled by it,
-- and it reads tables, so STABLE, not IMMUTABLE.
-- @plpgsql_check_options: security_warnings = false, extra_warnings = false, performance_warnings = false
BEGIN
    RETURN QUERY EXECUTE {schema}._spark_stream_sql(false) USING p_stream, p_batch, p_chunk;
END $$;

-- A page of one chunk of a stream batch (as spark_stream_read), packed for Arrow like
-- spark_read_packed: at most p_limit deliveries after position p_after (0: from the start);
-- last_key is the position the next page starts after (row_count 0: the chunk is done). Only the stream's own queue p_queue (the shard router
-- routes by it): another queue's stream reads nothing. Reads spark_stream_batch, spark_stream,
-- queue, message.
CREATE OR REPLACE FUNCTION {schema}.spark_stream_read_packed(
    p_queue   text,
    p_stream  uuid,
    p_batch   bigint,
    p_chunk   integer,
    p_columns text[],
    p_after   bigint  DEFAULT 0,
    p_limit   integer DEFAULT 10000
) RETURNS TABLE (row_count integer, last_key bigint, packed bytea[])
LANGUAGE plpgsql STABLE AS $$
-- Intended exceptions to plpgsql_check, which cannot see into dynamic SQL: the EXECUTEd text is
-- made of constant fragments only (_spark_stream_sql, _spark_pack_sql; the values go through
-- USING), the OUT columns are filled by it, and it reads tables, so STABLE, not IMMUTABLE.
-- @plpgsql_check_options: security_warnings = false, extra_warnings = false, performance_warnings = false
BEGIN
    PERFORM {schema}._spark_check_page(p_limit);
    IF NOT EXISTS (SELECT FROM {schema}.spark_stream s WHERE s.stream_id = p_stream AND s.queue = p_queue) THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE {schema}._spark_pack_sql({schema}._spark_stream_sql(true) || ' LIMIT $5',
                                                   'ord', p_columns)
        USING p_stream, p_batch, p_chunk, p_after, p_limit;
END $$;

-- Raises LQ002 unless a packed read's page size is sensible: 1..1,000,000 rows.
CREATE OR REPLACE FUNCTION {schema}._spark_check_page(p_limit integer) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000000 THEN
        PERFORM {schema}._invalid('a page is 1 to 1,000,000 rows');
    END IF;
END $$;

-- The query of a packed read: the rows of p_inner (a query whose select list is the read
-- columns of spark_read_messages in their order, then, for p_key 'ord', the rows' position;
-- ordered by p_key, with a LIMIT) as ONE row: row_count, last_key (the greatest p_key) and
-- packed: for each name in p_columns, in that order, its values packed so that a reader can
-- make Arrow arrays of them without a step per row:
--   id, enqueued_at, scheduled_at (never NULL)  one element: int8send of every value, concatenated;
--   dequeue_at, archived_at                     two: a validity byte per row (1: a value), the
--                                               int8send values (0 where NULL);
--   priority / attempts, deliveries             one: int2send / int4send of every value;
--   payload and the text columns (status,       two: int4send of every length in bytes (-1:
--   content_type, kind, key, channel, headers,  NULL), the values concatenated (text as UTF-8).
--   last_error, state)
-- A value is at most 1 GB: the caller sizes its pages (a page too large fails with SQLSTATE
-- 54000 and can be asked again, smaller). Raises LQ002 for any other name (queue: the caller's
-- constant). Builds text from its arguments' whitelisted names and constant fragments only:
-- IMMUTABLE.
CREATE OR REPLACE FUNCTION {schema}._spark_pack_sql(p_inner text, p_key text, p_columns text[])
RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_names text := 'queue, id, status, payload, content_type, kind, key, channel, headers, priority,'
                 || ' attempts, deliveries, enqueued_at, scheduled_at, dequeue_at, archived_at,'
                 || ' last_error, state';
    v_none  constant text := '''''::bytea';
    v_aggs  text[] := ARRAY[]::text[];
    v_c     text;
BEGIN
    IF p_key IS NULL OR p_key NOT IN ('id', 'ord') THEN
        PERFORM {schema}._invalid('the key of a packed read is id or ord');
    END IF;
    IF p_key = 'ord' THEN
        v_names := v_names || ', ord';
    END IF;
    FOREACH v_c IN ARRAY coalesce(p_columns, ARRAY[]::text[]) LOOP
        IF v_c IN ('id', 'enqueued_at', 'scheduled_at') THEN
            v_aggs := array_append(v_aggs, 'string_agg(int8send(r.' || v_c || '), ' || v_none || ')');
        ELSIF v_c IN ('dequeue_at', 'archived_at') THEN
            v_aggs := array_append(v_aggs, 'string_agg(CASE WHEN r.' || v_c || ' IS NULL THEN ''\x00''::bytea'
                                           || ' ELSE ''\x01''::bytea END, ' || v_none || ')');
            v_aggs := array_append(v_aggs, 'string_agg(int8send(coalesce(r.' || v_c || ', 0)), ' || v_none || ')');
        ELSIF v_c = 'priority' THEN
            v_aggs := array_append(v_aggs, 'string_agg(int2send(r.priority), ' || v_none || ')');
        ELSIF v_c IN ('attempts', 'deliveries') THEN
            v_aggs := array_append(v_aggs, 'string_agg(int4send(r.' || v_c || '), ' || v_none || ')');
        ELSIF v_c = 'payload' THEN
            v_aggs := array_append(v_aggs, 'string_agg(int4send(octet_length(r.payload)), ' || v_none || ')');
            v_aggs := array_append(v_aggs, 'string_agg(r.payload, ' || v_none || ')');
        ELSIF v_c IN ('status', 'content_type', 'kind', 'key', 'channel', 'headers', 'last_error', 'state') THEN
            v_aggs := array_append(v_aggs, 'string_agg(int4send(coalesce(octet_length(convert_to(r.' || v_c
                                           || ', ''UTF8'')), -1)), ' || v_none || ')');
            v_aggs := array_append(v_aggs, 'string_agg(convert_to(r.' || v_c || ', ''UTF8''), ' || v_none || ')');
        ELSE
            PERFORM {schema}._invalid(format('a packed read has no column %s', quote_literal(v_c)));
        END IF;
    END LOOP;
    RETURN 'SELECT count(*)::integer, max(r.' || p_key || '), ARRAY[' || array_to_string(v_aggs, ', ')
        || ']::bytea[] FROM (' || p_inner || ') AS r(' || v_names || ')';
END $$;

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

-- The query behind spark_read_messages (p_table 'messages') and spark_read_archive (any other
-- p_table), with a condition only for each filter given (not NULL), so that the planner, which
-- plans the EXECUTE with the caller's values, sees plain index conditions: id on the primary
-- key, key on message_key_idx (a prefix too when the database collation is C), channel on
-- message_channel_idx, status and archived_at on archive_status_idx. Values are never in the
-- text: the query reads them as $1..$15, in the parameter order of the two read functions ($4:
-- the instant status is judged at for messages, the one status for the archive). The queue is
-- a scalar subquery, not a join, so that an id range is one scan of the primary key in id order
-- (spark_read_packed pages through it with ORDER BY id LIMIT, without a sort). Builds text
-- from its arguments only: IMMUTABLE.
CREATE OR REPLACE FUNCTION {schema}._spark_read_sql(
    p_table      text,
    p_status     text,
    p_keys       text[],
    p_key_prefix text,
    p_channels   text[],
    p_kinds      text[],
    p_statuses   text[],
    p_times      bigint[]
) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_sql  text;
    v_time text[] := ARRAY['x.enqueued_at >= $10', 'x.enqueued_at <= $11',
                                    'x.scheduled_at >= $12', 'x.scheduled_at <= $13'];
BEGIN
    IF p_table = 'messages' THEN
        v_sql := 'SELECT $1, x.id, st.status, x.payload, x.content_type, x.kind, x.key, x.channel,'
              || ' x.headers::text, x.priority, x.attempts, x.deliveries, x.enqueued_at, x.scheduled_at,'
              || ' x.dequeue_at, NULL::bigint, x.last_error, x.state::text'
              || ' FROM {schema}.message x'
              || ' CROSS JOIN LATERAL (SELECT CASE WHEN x.dequeue_at <= $4 THEN ''ready'''
              || ' WHEN x.leased THEN ''leased'' ELSE ''scheduled'' END AS status) st'
              || ' WHERE x.queue_id = (SELECT q.id FROM {schema}.queue q WHERE q.name = $1)'
              || ' AND x.id >= $2 AND x.id < $3';
        v_time := v_time || ARRAY['x.dequeue_at >= $14', 'x.dequeue_at <= $15'];
    ELSE
        v_sql := 'SELECT $1, x.id, x.status AS status, x.payload, x.content_type, x.kind, x.key,'
              || ' x.channel, x.headers::text, x.priority, x.attempts, x.deliveries, x.enqueued_at,'
              || ' x.scheduled_at, NULL::bigint, x.archived_at, x.last_error, x.state::text'
              || ' FROM {schema}.archive x'
              || ' WHERE x.queue_id = (SELECT q.id FROM {schema}.queue q WHERE q.name = $1)'
              || ' AND x.id >= $2 AND x.id < $3';
        IF p_status IS NOT NULL THEN
            v_sql := v_sql || ' AND x.status = $4';
        END IF;
        v_time := v_time || ARRAY['x.archived_at >= $14', 'x.archived_at <= $15'];
    END IF;
    IF p_keys IS NOT NULL THEN
        v_sql := v_sql || ' AND x.key = ANY ($5)';
    END IF;
    IF p_key_prefix IS NOT NULL THEN
        v_sql := v_sql || ' AND x.key ^@ $6';
    END IF;
    -- A key names the current version of a message, as get() and cancel() by key do (a version
    -- superseded while leased keeps its key column but not the key): this is also what lets
    -- the key index, partial on superseded_by IS NULL, serve the condition.
    IF p_table = 'messages' AND (p_keys IS NOT NULL OR p_key_prefix IS NOT NULL) THEN
        v_sql := v_sql || ' AND x.superseded_by IS NULL';
    END IF;
    IF p_channels IS NOT NULL THEN
        v_sql := v_sql || ' AND x.channel = ANY ($7)';
    END IF;
    IF p_kinds IS NOT NULL THEN
        v_sql := v_sql || ' AND x.kind = ANY ($8)';
    END IF;
    IF p_statuses IS NOT NULL THEN
        v_sql := v_sql || CASE WHEN p_table = 'messages' THEN ' AND st.status = ANY ($9)'
                               ELSE ' AND x.status = ANY ($9)' END;
    END IF;
    FOR i IN 1 .. 6 LOOP
        IF p_times[i] IS NOT NULL THEN
            v_sql := v_sql || ' AND ' || v_time[i];
        END IF;
    END LOOP;
    RETURN v_sql;
END $$;

-- Live messages of a queue with p_lo <= id < p_hi that pass the filters Spark pushed down,
-- without leasing them. Each filter is off when NULL; arrays match any element; times are
-- inclusive epoch-ms bounds. status is judged at p_now, else when the statement started (one
-- instant for every row). The query is built by _spark_read_sql and planned with the values,
-- so filters become index conditions. Reads queue, message.
CREATE OR REPLACE FUNCTION {schema}.spark_read_messages(
    p_queue        text,
    p_lo           bigint,
    p_hi           bigint,
    p_now          bigint DEFAULT NULL,
    p_keys         text[] DEFAULT NULL,
    p_key_prefix   text   DEFAULT NULL,
    p_channels     text[] DEFAULT NULL,
    p_kinds        text[] DEFAULT NULL,
    p_statuses     text[] DEFAULT NULL,
    p_enqueued_lo  bigint DEFAULT NULL,
    p_enqueued_hi  bigint DEFAULT NULL,
    p_scheduled_lo bigint DEFAULT NULL,
    p_scheduled_hi bigint DEFAULT NULL,
    p_dequeue_lo   bigint DEFAULT NULL,
    p_dequeue_hi   bigint DEFAULT NULL
)
RETURNS TABLE (queue text, id bigint, status text, payload bytea, content_type text, kind text,
               key text, channel text, headers text, priority smallint, attempts integer,
               deliveries integer, enqueued_at bigint, scheduled_at bigint, dequeue_at bigint,
               archived_at bigint, last_error text, state text)
LANGUAGE plpgsql STABLE AS $$
-- Intended exceptions to plpgsql_check, which cannot see into dynamic SQL: the EXECUTEd text is
-- made of constant fragments only (_spark_read_sql; every value goes through USING), the OUT
-- columns are filled by it, and it reads tables, so STABLE, not IMMUTABLE. These are findings
-- about the whole function, which only the in-comment option reaches.
-- @plpgsql_check_options: security_warnings = false, extra_warnings = false, performance_warnings = false
BEGIN
    RETURN QUERY EXECUTE {schema}._spark_read_sql(
            'messages', NULL, p_keys, p_key_prefix, p_channels, p_kinds, p_statuses,
            ARRAY[p_enqueued_lo, p_enqueued_hi, p_scheduled_lo, p_scheduled_hi, p_dequeue_lo, p_dequeue_hi])
        USING p_queue, p_lo, p_hi,
              coalesce(p_now, (extract(epoch FROM statement_timestamp()) * 1000)::bigint),
              p_keys, p_key_prefix, p_channels, p_kinds, p_statuses, p_enqueued_lo, p_enqueued_hi,
              p_scheduled_lo, p_scheduled_hi, p_dequeue_lo, p_dequeue_hi;
END $$;

-- Archived messages of a queue with p_lo <= id < p_hi: all, or one status (p_status: 'acked',
-- 'dead'), that pass the pushed-down filters (as in spark_read_messages). Reads queue, archive.
CREATE OR REPLACE FUNCTION {schema}.spark_read_archive(
    p_queue        text,
    p_lo           bigint,
    p_hi           bigint,
    p_status       text   DEFAULT NULL,
    p_keys         text[] DEFAULT NULL,
    p_key_prefix   text   DEFAULT NULL,
    p_channels     text[] DEFAULT NULL,
    p_kinds        text[] DEFAULT NULL,
    p_statuses     text[] DEFAULT NULL,
    p_enqueued_lo  bigint DEFAULT NULL,
    p_enqueued_hi  bigint DEFAULT NULL,
    p_scheduled_lo bigint DEFAULT NULL,
    p_scheduled_hi bigint DEFAULT NULL,
    p_archived_lo  bigint DEFAULT NULL,
    p_archived_hi  bigint DEFAULT NULL
)
RETURNS TABLE (queue text, id bigint, status text, payload bytea, content_type text, kind text,
               key text, channel text, headers text, priority smallint, attempts integer,
               deliveries integer, enqueued_at bigint, scheduled_at bigint, dequeue_at bigint,
               archived_at bigint, last_error text, state text)
LANGUAGE plpgsql STABLE AS $$
-- Intended exceptions to plpgsql_check, which cannot see into dynamic SQL: the EXECUTEd text is
-- made of constant fragments only (_spark_read_sql; every value goes through USING), the OUT
-- columns are filled by it, and it reads tables, so STABLE, not IMMUTABLE. These are findings
-- about the whole function, which only the in-comment option reaches.
-- @plpgsql_check_options: security_warnings = false, extra_warnings = false, performance_warnings = false
BEGIN
    RETURN QUERY EXECUTE {schema}._spark_read_sql(
            'archive', p_status, p_keys, p_key_prefix, p_channels, p_kinds, p_statuses,
            ARRAY[p_enqueued_lo, p_enqueued_hi, p_scheduled_lo, p_scheduled_hi, p_archived_lo, p_archived_hi])
        USING p_queue, p_lo, p_hi, p_status, p_keys, p_key_prefix, p_channels, p_kinds, p_statuses,
              p_enqueued_lo, p_enqueued_hi, p_scheduled_lo, p_scheduled_hi, p_archived_lo, p_archived_hi;
END $$;

-- A page of a batch read, packed for Arrow (_spark_pack_sql): p_queue's live messages
-- (p_table 'messages'), its archive ('archive') or its dead letters ('dead') with
-- p_lo <= id < p_hi that pass the pushed-down filters, as spark_read_messages and
-- spark_read_archive return them (the same query, _spark_read_sql), in id order: at most
-- p_limit rows of p_columns (the read columns to return, queue excepted). row_count 0: nothing
-- left; else the next page starts after last_key.
-- status is judged at p_now, else when the transaction started: the pages of one transaction
-- (a REPEATABLE READ one reads one snapshot) agree. Reads queue, message or archive.
CREATE OR REPLACE FUNCTION {schema}.spark_read_packed(
    p_queue        text,
    p_table        text,
    p_columns      text[],
    p_lo           bigint,
    p_hi           bigint,
    p_limit        integer DEFAULT 10000,
    p_now          bigint DEFAULT NULL,
    p_keys         text[] DEFAULT NULL,
    p_key_prefix   text   DEFAULT NULL,
    p_channels     text[] DEFAULT NULL,
    p_kinds        text[] DEFAULT NULL,
    p_statuses     text[] DEFAULT NULL,
    p_enqueued_lo  bigint DEFAULT NULL,
    p_enqueued_hi  bigint DEFAULT NULL,
    p_scheduled_lo bigint DEFAULT NULL,
    p_scheduled_hi bigint DEFAULT NULL,
    p_dequeue_lo   bigint DEFAULT NULL,
    p_dequeue_hi   bigint DEFAULT NULL,
    p_archived_lo  bigint DEFAULT NULL,
    p_archived_hi  bigint DEFAULT NULL
) RETURNS TABLE (row_count integer, last_key bigint, packed bytea[])
LANGUAGE plpgsql STABLE AS $$
-- Intended exceptions to plpgsql_check, which cannot see into dynamic SQL: the EXECUTEd text is
-- made of constant fragments only (_spark_read_sql, _spark_pack_sql; every value goes through
-- USING), the OUT columns are filled by it, and it reads tables, so STABLE, not IMMUTABLE.
-- @plpgsql_check_options: security_warnings = false, extra_warnings = false, performance_warnings = false
DECLARE
    v_status text := CASE WHEN p_table = 'dead' THEN 'dead' END;
    v_table  text := CASE WHEN p_table = 'messages' THEN 'messages' ELSE 'archive' END;
    v_sql    text;
BEGIN
    IF p_table IS NULL OR p_table NOT IN ('messages', 'archive', 'dead') THEN
        PERFORM {schema}._invalid('table must be messages, archive or dead');
    END IF;
    PERFORM {schema}._spark_check_page(p_limit);
    v_sql := {schema}._spark_pack_sql(
        {schema}._spark_read_sql(
            v_table, v_status, p_keys, p_key_prefix, p_channels, p_kinds, p_statuses,
            ARRAY[p_enqueued_lo, p_enqueued_hi, p_scheduled_lo, p_scheduled_hi,
                  CASE WHEN v_table = 'messages' THEN p_dequeue_lo ELSE p_archived_lo END,
                  CASE WHEN v_table = 'messages' THEN p_dequeue_hi ELSE p_archived_hi END])
        || ' ORDER BY x.id LIMIT $16', 'id', p_columns);
    IF v_table = 'messages' THEN
        RETURN QUERY EXECUTE v_sql
            USING p_queue, p_lo, p_hi,
                  coalesce(p_now, (extract(epoch FROM transaction_timestamp()) * 1000)::bigint),
                  p_keys, p_key_prefix, p_channels, p_kinds, p_statuses, p_enqueued_lo, p_enqueued_hi,
                  p_scheduled_lo, p_scheduled_hi, p_dequeue_lo, p_dequeue_hi, p_limit;
    ELSE
        RETURN QUERY EXECUTE v_sql
            USING p_queue, p_lo, p_hi, v_status, p_keys, p_key_prefix, p_channels, p_kinds, p_statuses,
                  p_enqueued_lo, p_enqueued_hi, p_scheduled_lo, p_scheduled_hi, p_archived_lo,
                  p_archived_hi, p_limit;
    END IF;
END $$;

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

-- What a batch write with write id p_write_id did to p_queue, while its record is kept: the
-- messages it enqueued, when, until when reruns are recognised, and how many reruns it turned
-- into no-ops. No row: never committed (or expired). Reads spark_sink_commit.
CREATE OR REPLACE FUNCTION {schema}.spark_write_status(p_queue text, p_write_id text)
RETURNS TABLE (messages bigint, committed_at bigint, expires_at bigint, skipped bigint,
               last_skipped_at bigint)
LANGUAGE sql STABLE AS $$
    SELECT c.messages, c.committed_at, c.expires_at, c.skipped, c.last_skipped_at
      FROM {schema}.spark_sink_commit c
     WHERE c.queue = p_queue AND c.sink_id = 'write:' || p_write_id AND c.batch_id = 0
$$;

-- Forget write ids and streaming-sink batches whose retention ran out (at most p_limit rows);
-- called by maintain(). Returns the records deleted. Writes spark_sink_commit.
CREATE OR REPLACE FUNCTION {schema}.spark_prune(p_limit integer DEFAULT 10000, p_now bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := {schema}._now(p_now);
    v_n   bigint;
BEGIN
    PERFORM {schema}._check_limit(p_limit);
    DELETE FROM {schema}.spark_sink_commit c
     USING (SELECT o.queue, o.sink_id, o.batch_id FROM {schema}.spark_sink_commit o
             WHERE o.expires_at <= v_now LIMIT p_limit) old
     WHERE c.queue = old.queue AND c.sink_id = old.sink_id AND c.batch_id = old.batch_id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;
