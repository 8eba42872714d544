-- LonnyMQ send: every send (one message or many) is one send_batch call.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Batch send: parallel arrays, one element per message (NULL elements and NULL arrays allowed,
-- except payloads). Returns one row per input position (ord, 1-based) with the message id and
-- the outcome: 'created', 'updated' (a live message with the key was replaced) or 'ignored'
-- (a live message with the key exists; its id is returned).
-- p_on_conflict: 'ignore' | 'replace' | 'error'. A replace of a message that is not leased (or
-- whose lease expired) updates it in place and moves its fencing token on. A replace of a
-- message whose lease has not expired leaves that row with its holder, marked superseded_by the
-- new version, which is inserted as a new message (a new id, so no earlier token can settle
-- it; 'updated', with the new id): the holder's ack deletes only the old row, its nack or an
-- expired lease deletes it instead of retrying it (docs/messages.md).
-- Within one batch the first row of a key wins for 'ignore' and the last for 'replace'.
-- Messages get ids in input order, so a batch is FIFO. The messages created are counted in
-- sent_count (queue_metrics' total_sent) and in queue_stat (the minute's counters, stats.sql):
-- one appended row each per call, never an update.
CREATE OR REPLACE FUNCTION {schema}.send_batch(
    p_queue         text,
    p_payloads      bytea[],
    p_kinds         text[]     DEFAULT NULL,
    p_content_types text[]     DEFAULT NULL,
    p_headers       jsonb[]    DEFAULT NULL,
    p_at_ms         bigint[]   DEFAULT NULL,
    p_delays_ms     bigint[]   DEFAULT NULL,
    p_priorities    smallint[] DEFAULT NULL,
    p_keys          text[]     DEFAULT NULL,
    p_channels      text[]     DEFAULT NULL,
    p_on_conflict   text       DEFAULT 'ignore',
    p_now           bigint     DEFAULT NULL
) RETURNS TABLE (ord bigint, id bigint, outcome text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q         {schema}.queue := {schema}._queue(p_queue);
    v_now     bigint := {schema}._now(p_now);
    v_n       integer := coalesce(cardinality(p_payloads), 0);
    v_bad     record;
    v_ids     bigint[];
    v_keys    text[];
    v_created boolean[];
    -- Channel bookkeeping: needed when the batch names channels or a replace moves a message
    -- out of one; v_old_* is what the replaced messages were.
    v_book         boolean;
    v_old_ids      bigint[];
    v_old_channels text[];
    v_old_leased   boolean[];
    v_ords         bigint[];
    v_res          bigint[];
    v_outcomes     text[];
    v_sup_ids      bigint[];  -- leased messages superseded by a new version in this call
    v_sup_keys     text[];
    v_gen          bigint;  -- the generation new and replaced messages go to (generations.sql)
BEGIN
    IF p_on_conflict IS NULL OR p_on_conflict NOT IN ('ignore', 'replace', 'error') THEN
        PERFORM {schema}._invalid('on_conflict must be ignore, replace or error');
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF (p_kinds IS NOT NULL AND cardinality(p_kinds) <> v_n)
       OR (p_content_types IS NOT NULL AND cardinality(p_content_types) <> v_n)
       OR (p_headers IS NOT NULL AND cardinality(p_headers) <> v_n)
       OR (p_at_ms IS NOT NULL AND cardinality(p_at_ms) <> v_n)
       OR (p_delays_ms IS NOT NULL AND cardinality(p_delays_ms) <> v_n)
       OR (p_priorities IS NOT NULL AND cardinality(p_priorities) <> v_n)
       OR (p_keys IS NOT NULL AND cardinality(p_keys) <> v_n)
       OR (p_channels IS NOT NULL AND cardinality(p_channels) <> v_n) THEN
        PERFORM {schema}._invalid('all per-message arrays must have as many elements as payloads');
    END IF;

    -- Validate everything before writing anything: a bad batch writes nothing.
    SELECT t.ord, octet_length(t.payload) AS size, t.priority, t.delay_ms, t.payload IS NULL AS nullp,
           t.headers IS NOT NULL AND jsonb_typeof(t.headers) <> 'object' AS badh
      INTO v_bad
      FROM unnest(p_payloads, p_priorities, p_delays_ms, p_headers)
           WITH ORDINALITY AS t(payload, priority, delay_ms, headers, ord)
     WHERE t.payload IS NULL OR octet_length(t.payload) > q.max_payload_bytes
        OR t.priority NOT BETWEEN -100 AND 100 OR t.delay_ms < 0
        OR (t.headers IS NOT NULL AND jsonb_typeof(t.headers) <> 'object')
     LIMIT 1;
    IF FOUND THEN
        IF v_bad.nullp THEN
            PERFORM {schema}._invalid(format('message %s has no payload', v_bad.ord));
        ELSIF v_bad.size > q.max_payload_bytes THEN
            RAISE EXCEPTION 'message % payload is % bytes; queue % allows at most %', v_bad.ord,
                v_bad.size, quote_literal(q.name), q.max_payload_bytes USING ERRCODE = 'LQ003';
        ELSIF v_bad.badh THEN
            PERFORM {schema}._invalid(format('message %s headers must be a JSON object', v_bad.ord));
        ELSIF v_bad.delay_ms < 0 THEN
            PERFORM {schema}._invalid(format('message %s delay must be >= 0', v_bad.ord));
        ELSE
            PERFORM {schema}._invalid(format('message %s priority %s is outside -100..100',
                                             v_bad.ord, v_bad.priority));
        END IF;
    END IF;

    IF EXISTS (SELECT FROM unnest(p_channels) c WHERE length(c) NOT BETWEEN 1 AND 512) THEN
        PERFORM {schema}._invalid('a channel name must have 1 to 512 characters');
    END IF;
    v_book := EXISTS (SELECT FROM unnest(p_channels) c WHERE c IS NOT NULL);
    IF v_book THEN
        PERFORM {schema}._channel_enable(q.id);
    END IF;

    PERFORM {schema}._wake(q.id, q.name);
    v_gen := {schema}._gen_write();

    IF p_keys IS NULL OR NOT EXISTS (SELECT FROM unnest(p_keys) k WHERE k IS NOT NULL) THEN
        -- No keys: plain insert; ids are assigned in input order. Without channels nothing
        -- is dropped, so the batch's sent_count row is written by the same statement.
        WITH ins AS (
            INSERT INTO {schema}.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                              priority, channel, kind, content_type, headers, payload)
            SELECT q.id, v_gen, {schema}._dequeue_at(t.at, t.priority, q.priority_step_ms, v_now), t.at, v_now, t.priority,
                   t.channel, t.kind, t.content_type, t.headers, t.payload
              FROM (SELECT coalesce(u.at_ms, v_now + coalesce(u.delay_ms, 0)) AS at,
                           coalesce(u.priority, 0) AS priority, u.channel, u.kind, u.content_type,
                           u.headers, u.payload, u.ord
                      FROM unnest(p_payloads, p_kinds, p_content_types, p_headers, p_at_ms,
                                  p_delays_ms, p_priorities, p_channels)
                           WITH ORDINALITY AS u(payload, kind, content_type, headers, at_ms,
                                                delay_ms, priority, channel, ord)) t
             ORDER BY t.ord
            RETURNING m.id
        ), cnt AS (
            INSERT INTO {schema}.sent_count (queue_id, n)
            SELECT q.id, count(*) FROM ins HAVING NOT v_book
        ), st AS (
            INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
            SELECT q.id, v_now / 60000, count(*) FROM ins HAVING NOT v_book
        )
        SELECT array_agg(ins.id ORDER BY ins.id) INTO v_ids FROM ins;
        IF v_book THEN
            SELECT array_agg(r.ord ORDER BY r.ord), array_agg(r.id ORDER BY r.ord),
                   array_agg(r.outcome ORDER BY r.ord)
              INTO v_ords, v_res, v_outcomes
              FROM {schema}._channel_send(
                q, p_channels, ARRAY(SELECT generate_series(1, v_n)::bigint), v_ids,
                array_fill('created'::text, ARRAY[v_n]), NULL, NULL, NULL, v_now) r;
            -- Dropped messages (a full channel) were not sent.
            WITH n AS (
                SELECT count(*) AS n FROM unnest(v_outcomes) o WHERE o = 'created'
            ), st AS (
                INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
                SELECT q.id, v_now / 60000, n.n FROM n WHERE n.n > 0
            )
            INSERT INTO {schema}.sent_count (queue_id, n) SELECT q.id, n.n FROM n WHERE n.n > 0;
            RETURN QUERY SELECT * FROM unnest(v_ords, v_res, v_outcomes);
        ELSE
            RETURN QUERY SELECT u.ord, u.id, 'created'::text
                           FROM unnest(v_ids) WITH ORDINALITY AS u(id, ord);
        END IF;
        RETURN;
    END IF;

    -- A replace ends an expired lease and may move a message between channels: lock the live
    -- messages of the batch's keys first (in id order, so concurrent replacers cannot deadlock)
    -- to know what they were, and replace only those.
    IF p_on_conflict = 'replace' THEN
        SELECT array_agg(o.id ORDER BY o.id), array_agg(o.channel ORDER BY o.id),
               array_agg(o.leased ORDER BY o.id)
          INTO v_old_ids, v_old_channels, v_old_leased
          FROM (SELECT m.id, m.channel, m.leased FROM {schema}.message m
                 WHERE m.queue_id = q.id AND m.key = ANY (p_keys) AND m.superseded_by IS NULL
                 ORDER BY m.id
                   FOR UPDATE) o;
        v_book := v_book OR EXISTS (SELECT FROM unnest(v_old_channels) c WHERE c IS NOT NULL);
        -- Messages whose lease has not expired stay with their holders: they leave the key
        -- (superseded_by, 0 until the new version's id is known) so that the insert below
        -- creates the new version; it is reported 'updated'. They stay in their channels.
        WITH s AS (
            UPDATE {schema}.message m SET superseded_by = 0
             WHERE m.queue_id = q.id AND m.id = ANY (v_old_ids) AND m.leased IS TRUE
               AND m.dequeue_at > v_now
            RETURNING m.id, m.key
        )
        SELECT array_agg(s.id), array_agg(s.key) INTO v_sup_ids, v_sup_keys FROM s;
    END IF;

    -- Keyed: only the winning row of each key is written; 'replace' first updates live
    -- unleased messages with the key, then the insert skips every key that exists.
        WITH t AS (
            SELECT coalesce(u.at_ms, v_now + coalesce(u.delay_ms, 0)) AS at,
                   coalesce(u.priority, 0) AS priority, u.channel, u.kind, u.content_type,
                   u.headers, u.payload, u.key, u.ord,
                   CASE WHEN u.key IS NULL OR p_on_conflict = 'error' THEN u.ord
                        WHEN p_on_conflict = 'ignore' THEN min(u.ord) OVER (PARTITION BY u.key)
                        ELSE max(u.ord) OVER (PARTITION BY u.key) END AS win
              FROM unnest(p_payloads, p_kinds, p_content_types, p_headers, p_at_ms, p_delays_ms,
                          p_priorities, p_keys, p_channels)
                   WITH ORDINALITY AS u(payload, kind, content_type, headers, at_ms, delay_ms,
                                        priority, key, channel, ord)
        ), upd AS (
            -- deliveries (the fencing token) moves on: no token handed out before the update
            -- can settle the new version, nor report an earlier settle of it as its own.
            UPDATE {schema}.message m
               SET dequeue_at = {schema}._dequeue_at(t.at, t.priority, q.priority_step_ms, v_now), scheduled_at = t.at,
                   priority = t.priority, channel = t.channel, kind = t.kind,
                   content_type = t.content_type, headers = t.headers, payload = t.payload,
                   attempts = 0, deliveries = m.deliveries + 1, leased = false, state = NULL,
                   last_error = NULL, gen = v_gen
              FROM t
             WHERE p_on_conflict = 'replace' AND t.ord = t.win AND t.key IS NOT NULL
               AND m.queue_id = q.id AND m.key = t.key AND NOT (m.leased AND m.dequeue_at > v_now)
               AND m.id = ANY (v_old_ids)
            RETURNING m.id, m.key
        ), ins AS (
            -- Keys that exist (or were just replaced above) are skipped here.
            INSERT INTO {schema}.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                              priority, key, channel, kind, content_type, headers,
                                              payload)
            SELECT q.id, v_gen, {schema}._dequeue_at(t.at, t.priority, q.priority_step_ms, v_now), t.at, v_now, t.priority, t.key,
                   t.channel, t.kind, t.content_type, t.headers, t.payload
              FROM t WHERE t.ord = t.win ORDER BY t.ord
            ON CONFLICT (queue_id, key) WHERE key IS NOT NULL AND superseded_by IS NULL DO NOTHING
            RETURNING m.id, m.key
        )
        SELECT array_agg(x.id ORDER BY x.id), array_agg(x.key ORDER BY x.id),
               array_agg(x.created ORDER BY x.id)
          INTO v_ids, v_keys, v_created
          FROM (SELECT ins.id, ins.key, NOT coalesce(ins.key = ANY (v_sup_keys), false) AS created FROM ins
                UNION ALL
                SELECT upd.id, upd.key, false FROM upd) x;
    -- In 'error' mode every row attempts the insert; one that came back neither created nor
    -- updated hit a live key (the raise undoes the whole batch).
    IF v_sup_ids IS NOT NULL THEN
        UPDATE {schema}.message m SET superseded_by = n.id
          FROM unnest(v_ids, v_keys) AS n(id, key)
         WHERE m.queue_id = q.id AND m.id = ANY (v_sup_ids) AND n.key = m.key;
    END IF;
    IF p_on_conflict = 'error' AND coalesce(cardinality(v_ids), 0) < v_n THEN
        RAISE EXCEPTION 'a live message with the same key exists in queue %', quote_literal(q.name)
            USING ERRCODE = 'LQ004';
    END IF;

    WITH s AS (
        SELECT u.key, u.ord,
               CASE WHEN u.key IS NULL OR p_on_conflict = 'error' THEN u.ord
                    WHEN p_on_conflict = 'ignore' THEN min(u.ord) OVER (PARTITION BY u.key)
                    ELSE max(u.ord) OVER (PARTITION BY u.key) END AS win
          FROM unnest(p_keys) WITH ORDINALITY AS u(key, ord)
    ), r AS (
        SELECT * FROM unnest(v_ids, v_keys, v_created) AS r(id, key, created)
    ), plain_s AS (
        SELECT s.ord, row_number() OVER (ORDER BY s.ord) AS rn FROM s WHERE s.key IS NULL
    ), plain_r AS (
        SELECT r.id, row_number() OVER (ORDER BY r.id) AS rn FROM r WHERE r.key IS NULL
    ), f(ord, id, outcome) AS (
    SELECT plain_s.ord, plain_r.id, 'created'::text
      FROM plain_s JOIN plain_r USING (rn)
    UNION ALL
    SELECT s.ord, coalesce(r.id, (SELECT m.id FROM {schema}.message m
                                   WHERE m.queue_id = q.id AND m.key = s.key
                                     AND m.superseded_by IS NULL)),
           CASE WHEN r.id IS NULL OR s.ord <> s.win THEN 'ignored'
                WHEN r.created THEN 'created' ELSE 'updated' END
      FROM s LEFT JOIN r ON r.key = s.key
     WHERE s.key IS NOT NULL
    )
    SELECT array_agg(f.ord ORDER BY f.ord), array_agg(f.id ORDER BY f.ord),
           array_agg(f.outcome ORDER BY f.ord)
      INTO v_ords, v_res, v_outcomes
      FROM f;
    IF v_book THEN
        SELECT array_agg(r.ord ORDER BY r.ord), array_agg(r.id ORDER BY r.ord),
               array_agg(r.outcome ORDER BY r.ord)
          INTO v_ords, v_res, v_outcomes
          FROM {schema}._channel_send(
            q, p_channels, v_ords, v_res, v_outcomes, v_old_ids, v_old_channels, v_old_leased,
            v_now) r;
    END IF;
    -- Messages created (not updated, ignored or dropped) count as sent.
    WITH n AS (
        SELECT count(*) AS n FROM unnest(v_outcomes) o WHERE o = 'created'
    ), st AS (
        INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
        SELECT q.id, v_now / 60000, n.n FROM n WHERE n.n > 0
    )
    INSERT INTO {schema}.sent_count (queue_id, n) SELECT q.id, n.n FROM n WHERE n.n > 0;
    RETURN QUERY SELECT * FROM unnest(v_ords, v_res, v_outcomes);
END $$;
