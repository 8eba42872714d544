-- LonnyMQ send: send_batch (any number of messages, every option), send (one message: a
-- lean path of one statement for the plain case, send_batch for the rest) and send_plain (one
-- message without options: send's plain statement, the id returned) and send_plain_once (the
-- same with a send key: send's keyed statement, the id returned). A send call may
-- carry a send key (p_send_key): a repeat of the call with the same key creates nothing and
-- returns what the first call returned (table send_key, migration 0013; docs/messages.md).
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
-- queue_stat (the minute's counters, stats.sql, whose sums are also queue_metrics' total_sent):
-- one appended row per call, never an update.
-- p_send_key: the call's idempotency key (after p_now so that positional calls keep working).
-- Its send_key row is inserted before anything else is written (a repeat running concurrently
-- waits for the first on that row's index entry) and filled with the result at the end; a call
-- whose key the queue has recorded writes nothing and returns the recorded result (its
-- arguments are not compared: the key names the call). An empty batch records no key.
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
    p_now           bigint     DEFAULT NULL,
    p_send_key      uuid       DEFAULT NULL
) RETURNS TABLE (ord bigint, id bigint, outcome text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q         {schema}.queue;
    v_now     bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    v_n       integer := coalesce(cardinality(p_payloads), 0);
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
    -- The plain batch (no keys, channels or send key; p_now, if any, not ahead of the clock):
    -- one statement, as send()'s plain one (keep them in step): it finds the queue by name,
    -- holds the generation and the send lock (_gen_write and _wake, inlined), checks each
    -- message in the insert's own pass over the arrays (a bad one raises _send_bad's error,
    -- which undoes the whole statement: a bad batch writes nothing), inserts the messages in
    -- input order (the ordinality's order: ids in input order) and the call's queue_stat row,
    -- and returns the ids in that order. Fewer statements and no second scan of the arrays
    -- (benchmarks/server_instructions.py, send_batch100: docs/pgmq.md). Anything it does not
    -- write (an unknown queue, a generation that moved) goes on below, which raises or sends
    -- with the same semantics; so does a p_now ahead of the clock (_now's role check).
    IF p_keys IS NULL AND p_channels IS NULL AND p_send_key IS NULL AND v_n > 0
       AND (p_now IS NULL OR p_now <= v_now + 1000)
       AND p_on_conflict IN ('ignore', 'replace', 'error')
       AND (p_kinds IS NULL OR cardinality(p_kinds) = v_n)
       AND (p_content_types IS NULL OR cardinality(p_content_types) = v_n)
       AND (p_headers IS NULL OR cardinality(p_headers) = v_n)
       AND (p_at_ms IS NULL OR cardinality(p_at_ms) = v_n)
       AND (p_delays_ms IS NULL OR cardinality(p_delays_ms) = v_n)
       AND (p_priorities IS NULL OR cardinality(p_priorities) = v_n) THEN
        v_now := coalesce(p_now, v_now);
        v_gen := pg_sequence_last_value('{schema}.message_gen_seq');  -- _gen_write()'s first read
        RETURN QUERY
            WITH ins AS (
                INSERT INTO {schema}.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                  priority, kind, content_type, headers, payload)
                SELECT x.id, g.gen, {schema}._dequeue_at(u.at, u.priority, x.priority_step_ms, v_now), u.at,
                       v_now, u.priority, u.kind, u.content_type, u.headers, u.payload
                  FROM {schema}.queue x
                 CROSS JOIN LATERAL (
                       -- As in send(): the generation's hold and the wake-up, once.
                       SELECT v_gen AS gen,
                              pg_advisory_xact_lock_shared(hashtext({schema_name} || '/gen') & 2147483647,
                                                           (v_gen % 2147483647)::integer)::text AS held,
                              CASE WHEN current_setting('lonnymq.wake', true) = 'always'
                                     OR NOT pg_try_advisory_xact_lock_shared(
                                            hashtext({schema_name} || '/send') & 2147483647, x.id)
                                   THEN pg_notify({schema_name}, x.name)::text
                                   WHEN pg_try_advisory_lock(hashtext({schema_name} || '/wait') & 2147483647, x.id)
                                   THEN pg_advisory_unlock(hashtext({schema_name} || '/wait') & 2147483647, x.id)::text
                                   ELSE pg_notify({schema_name}, x.name)::text END AS woke
                       OFFSET 0) g
                 CROSS JOIN (
                       SELECT coalesce(b.at_ms, v_now + coalesce(b.delay_ms, 0)) AS at,
                              coalesce(b.priority, 0) AS priority, b.kind, b.content_type, b.headers,
                              b.payload, b.delay_ms, b.ord
                         FROM unnest(p_payloads, p_kinds, p_content_types, p_headers, p_at_ms,
                                     p_delays_ms, p_priorities)
                              WITH ORDINALITY AS b(payload, kind, content_type, headers, at_ms,
                                                   delay_ms, priority, ord)) u
                 WHERE x.name = p_queue
                   AND g.held IS NOT NULL AND g.woke IS NOT NULL  -- (always: keeps the calls)
                   -- Still the current generation now that we hold it (else below).
                   AND g.gen = pg_sequence_last_value('{schema}.message_gen_seq')
                   -- The message's checks (the general path's, below); a bad one raises.
                   AND ((u.payload IS NULL OR octet_length(u.payload) > x.max_payload_bytes
                         OR u.priority NOT BETWEEN -100 AND 100 OR u.delay_ms < 0
                         OR (u.headers IS NOT NULL AND jsonb_typeof(u.headers) <> 'object')) IS NOT TRUE
                        OR {schema}._send_bad(x.name, x.max_payload_bytes, u.ord, u.payload, u.priority,
                                              u.delay_ms, u.headers))
                 ORDER BY u.ord
                RETURNING m.id, m.queue_id
            ), st AS (
                INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
                SELECT min(ins.queue_id), v_now / 60000, count(*) FROM ins HAVING count(*) > 0
            )
            -- The ids in the order they were inserted (input order), numbered: no sort, no
            -- window (a row_number() over a sort by id cost a tenth of the call).
            SELECT r.ord, r.id, 'created'::text
              FROM unnest((SELECT array_agg(ins.id) FROM ins)) WITH ORDINALITY AS r(id, ord);
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    q := {schema}._queue(p_queue);
    v_now := {schema}._now(p_now);
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
    PERFORM {schema}._send_bad(q.name, q.max_payload_bytes, t.ord, t.payload, coalesce(t.priority, 0),
                               t.delay_ms, t.headers)
       FROM unnest(p_payloads, p_priorities, p_delays_ms, p_headers)
            WITH ORDINALITY AS t(payload, priority, delay_ms, headers, ord)
      WHERE t.payload IS NULL OR octet_length(t.payload) > q.max_payload_bytes
         OR t.priority NOT BETWEEN -100 AND 100 OR t.delay_ms < 0
         OR (t.headers IS NOT NULL AND jsonb_typeof(t.headers) <> 'object')
      LIMIT 1;

    IF EXISTS (SELECT FROM unnest(p_channels) c WHERE length(c) NOT BETWEEN 1 AND 512) THEN
        PERFORM {schema}._invalid('a channel name must have 1 to 512 characters');
    END IF;
    -- A repeat of a call that committed: its recorded result, nothing written. (A first call
    -- still running holds the key's index entry: this insert waits for it to end.)
    IF p_send_key IS NOT NULL THEN
        INSERT INTO {schema}.send_key AS k (queue_id, key, at_ms) VALUES (q.id, p_send_key, v_now)
        ON CONFLICT (queue_id, key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT * FROM {schema}._send_key_result(q.id, p_send_key);
            RETURN;
        END IF;
    END IF;

    v_book := EXISTS (SELECT FROM unnest(p_channels) c WHERE c IS NOT NULL);
    IF v_book THEN
        PERFORM {schema}._channel_enable(q.id);
    END IF;

    PERFORM {schema}._wake(q.id, q.name);
    v_gen := {schema}._gen_write();

    IF p_keys IS NULL OR NOT EXISTS (SELECT FROM unnest(p_keys) k WHERE k IS NOT NULL) THEN
        -- No keys: plain insert; ids are assigned in input order. Without channels nothing
        -- is dropped, so the batch's queue_stat row is written by the same statement.
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
            INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
            SELECT q.id, v_now / 60000, n.n
              FROM (SELECT count(*) AS n FROM unnest(v_outcomes) o WHERE o = 'created') n
             WHERE n.n > 0;
            IF p_send_key IS NOT NULL THEN
                PERFORM {schema}._send_key_record(q.id, p_send_key, v_res, v_outcomes);
            END IF;
            RETURN QUERY SELECT * FROM unnest(v_ords, v_res, v_outcomes);
        ELSE
            IF p_send_key IS NOT NULL THEN
                PERFORM {schema}._send_key_record(q.id, p_send_key, v_ids, NULL);
            END IF;
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
    INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
    SELECT q.id, v_now / 60000, n.n
      FROM (SELECT count(*) AS n FROM unnest(v_outcomes) o WHERE o = 'created') n
     WHERE n.n > 0;
    IF p_send_key IS NOT NULL THEN
        PERFORM {schema}._send_key_record(q.id, p_send_key, v_res, v_outcomes);
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_ords, v_res, v_outcomes);
END $$;

-- Raises the error of message p_ord of a batch for queue p_queue (at most p_max payload bytes)
-- whose checks failed: no payload, payload too large (LQ003), headers not a JSON object, a
-- negative delay, a priority outside -100..100 (LQ002), the first that applies. Returns false
-- for a message that passes them all (send_batch calls it only for one that does not). Touches
-- no table.
CREATE OR REPLACE FUNCTION {schema}._send_bad(p_queue text, p_max integer, p_ord bigint, p_payload bytea,
                                              p_priority integer, p_delay_ms bigint, p_headers jsonb)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_payload IS NULL THEN
        PERFORM {schema}._invalid(format('message %s has no payload', p_ord));
    ELSIF octet_length(p_payload) > p_max THEN
        RAISE EXCEPTION 'message % payload is % bytes; queue % allows at most %', p_ord,
            octet_length(p_payload), quote_literal(p_queue), p_max USING ERRCODE = 'LQ003';
    ELSIF p_headers IS NOT NULL AND jsonb_typeof(p_headers) <> 'object' THEN
        PERFORM {schema}._invalid(format('message %s headers must be a JSON object', p_ord));
    ELSIF p_delay_ms < 0 THEN
        PERFORM {schema}._invalid(format('message %s delay must be >= 0', p_ord));
    ELSIF p_priority NOT BETWEEN -100 AND 100 THEN
        PERFORM {schema}._invalid(format('message %s priority %s is outside -100..100', p_ord, p_priority));
    END IF;
    RETURN false;
END $$;

-- Record what the call with send key p_key did on queue p_queue_id: its ids in input order and
-- their outcomes (NULL when every one was 'created'). The row was inserted by the same call.
-- Writes send_key.
CREATE OR REPLACE FUNCTION {schema}._send_key_record(p_queue_id integer, p_key uuid, p_ids bigint[],
                                          p_outcomes text[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE {schema}.send_key k
       SET ids = coalesce(p_ids, ARRAY[]::bigint[]),
           outcomes = CASE WHEN 'created' = ALL (coalesce(p_outcomes, ARRAY[]::text[])) THEN NULL
                           ELSE p_outcomes END
     WHERE k.queue_id = p_queue_id AND k.key = p_key;
END $$;

-- What the call with send key p_key did on queue p_queue_id, as send_batch returns it (ord,
-- id, outcome), from its send_key row. Reads send_key.
CREATE OR REPLACE FUNCTION {schema}._send_key_result(p_queue_id integer, p_key uuid)
RETURNS TABLE (ord bigint, id bigint, outcome text)
LANGUAGE sql STABLE AS $$
    SELECT u.ord, u.id, coalesce(u.outcome, 'created')
      FROM {schema}.send_key k
     CROSS JOIN LATERAL unnest(k.ids, k.outcomes) WITH ORDINALITY AS u(id, outcome, ord)
     WHERE k.queue_id = p_queue_id AND k.key = p_key
     ORDER BY u.ord
$$;

-- Whether send() or send_plain() may write its message to queue p_queue_id (named
-- p_queue_name, at most p_max payload bytes) in generation p_gen (read before the call): a
-- payload (not NULL: send_plain checks it nowhere else) within the limit; then
-- _gen_write()'s hold (generation p_gen, shared, until commit); then _wake() (the queue's send
-- lock, shared, until commit, and a notification if a consumer waits); then p_gen still the
-- current generation now that it is held (false after a rotation: send_batch's path). Those two
-- helpers inlined: keep them in step. One CASE, so that its parts run in this order, once per
-- queue row. A SQL function that the planner inlines into send()'s statements (tested: their
-- plans show its calls in the queue scan's filter), so it costs no call of its own, and no
-- join to a subquery of the locks (a nested loop, a subquery scan and a result node, each
-- costing its start-up at every call). VOLATILE: it takes locks and notifies.
CREATE OR REPLACE FUNCTION {schema}._send_ok(p_queue_id integer, p_queue_name text, p_max integer,
                                             p_payload bytea, p_gen bigint)
RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN (octet_length(p_payload) <= p_max) IS NOT TRUE  -- (a NULL payload: send_batch)
                  -- _gen_write()'s hold (void: never NULL).
                  OR pg_advisory_xact_lock_shared(hashtext({schema_name} || '/gen') & 2147483647,
                                                  (p_gen % 2147483647)::integer) IS NULL
                  -- _wake() (false whatever it does).
                  OR CASE WHEN current_setting('lonnymq.wake', true) = 'always'
                            OR NOT pg_try_advisory_xact_lock_shared(
                                   hashtext({schema_name} || '/send') & 2147483647, p_queue_id)
                          THEN pg_notify({schema_name}, p_queue_name) IS NULL
                          WHEN pg_try_advisory_lock(hashtext({schema_name} || '/wait') & 2147483647, p_queue_id)
                          THEN NOT pg_advisory_unlock(hashtext({schema_name} || '/wait') & 2147483647, p_queue_id)
                          ELSE pg_notify({schema_name}, p_queue_name) IS NULL END
                THEN false
                ELSE p_gen = pg_sequence_last_value('{schema}.message_gen_seq') END
$$;

-- Send one message: what Client.send() calls, one round trip. Returns its id and outcome as
-- send_batch does (one row). The plain case (no key, no channel), the one producers repeat
-- most, is a single statement with a cached plan: it finds the queue by name (its unique
-- index), takes the writer's hold on the current generation (_gen_write) and the wake-up's
-- send lock, notifying a waiting consumer (_wake), inserts the message and its queue_stat row
-- (the one counter of sends). Those two helpers are inlined (a nested plpgsql call costs more
-- than all of their work), as the queue scan's filter (_send_ok, a SQL function the planner
-- inlines); keep them in step. The generation is read before the statement
-- (pg_sequence_last_value: message_gen_seq is never reset to uncalled, and a NULL only takes
-- send_batch's path) and re-read in it once held, as _gen_write does; reading it with
-- function calls rather than scans of the sequence keeps sequential scans, and their
-- disable_cost under enable_seqscan = off, out of the plans (benchmarks/server_instructions.py:
-- every plan node costs its start-up at every call). With p_send_key a statement of its own
-- does the same and first inserts the key's send_key row (the id comes from the message
-- sequence first, so that the key row can hold it). Two statements, not one that inserts the
-- key when there is one: a statement that names send_key opens and locks it and its two
-- indexes at every executor start-up, key or none (a tenth of a plain send's server CPU, issue
-- 12); keep the two in step (tests/sql/test_send_lean.py compares them), and send_plain's copy
-- of the plain one below (tests/sql/test_send_plain.py: calling send_plain from here cost SQL
-- callers of send() 12 %, docs/benchmarks.md). Everything else, and
-- anything those statements do not write (an unknown queue, a payload over the queue's limit:
-- errors; a key already recorded: a repeat; a generation that moved while we took it: rare)
-- goes through send_batch, which raises, replays or sends with the same semantics. Paused
-- queues accept sends; an UNLOGGED queue's message goes to message_unlogged like any other.
-- Pinned plans: enable_seqscan = off (a plan made while the queue table was tiny would scan
-- it; tests/sql/test_plans.py). No jit = off: with no sequential scan (tested), no plan here
-- costs anywhere near jit_above_cost.
CREATE OR REPLACE FUNCTION {schema}.send(
    p_queue        text,
    p_payload      bytea,
    p_content_type text     DEFAULT NULL,
    p_kind         text     DEFAULT NULL,
    p_headers      jsonb    DEFAULT NULL,
    p_at_ms        bigint   DEFAULT NULL,
    p_delay_ms     bigint   DEFAULT NULL,
    p_priority     smallint DEFAULT 0,
    p_key          text     DEFAULT NULL,
    p_channel      text     DEFAULT NULL,
    p_on_conflict  text     DEFAULT 'ignore',
    p_send_key     uuid     DEFAULT NULL,
    p_now          bigint   DEFAULT NULL
) RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
    v_now  bigint;
    v_at   bigint;
    v_gen  bigint;
BEGIN
    IF p_now IS NULL THEN
        v_now := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    ELSE
        v_now := {schema}._now(p_now);
    END IF;
    -- Argument checks that need no queue, inline: a failing one takes send_batch's path, which
    -- raises the error.
    IF p_key IS NULL AND p_channel IS NULL AND p_payload IS NOT NULL AND p_priority BETWEEN -100 AND 100
       AND (p_delay_ms IS NULL OR p_delay_ms >= 0)
       AND (p_headers IS NULL OR jsonb_typeof(p_headers) = 'object')
       AND p_on_conflict IN ('ignore', 'replace', 'error') THEN
        v_at := coalesce(p_at_ms, v_now + coalesce(p_delay_ms, 0));
        v_gen := pg_sequence_last_value('{schema}.message_gen_seq');  -- _gen_write()'s first read
        IF p_send_key IS NULL THEN
            -- One INSERT ... SELECT from the queue's row, found by its name's unique index,
            -- whose filter (_send_ok, inlined) checks the payload's size, holds the generation,
            -- wakes a waiting consumer and re-reads the generation, in that order. No subquery
            -- for the locks, no CTE for the queue (a CTE scan and its materialisation), no
            -- explicit id (nextval() in the SELECT list would keep it a subquery scan of its
            -- own: the identity default takes the same sequence).
            RETURN QUERY
                WITH ins AS (
                    INSERT INTO {schema}.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT x.id, v_gen,
                           {schema}._dequeue_at(v_at, p_priority, x.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM {schema}.queue x
                     WHERE x.name = p_queue
                       AND {schema}._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id, 'created'::text FROM ins;
        ELSE
            -- The same (keep them in step), the key's send_key row first: the message's id
            -- comes from the sequence first (in q, which both inserts read), so that the key
            -- row can hold it; a key the queue has recorded (or that a running call holds: the
            -- insert waits for it) inserts nothing.
            RETURN QUERY
                WITH q AS (
                    SELECT x.id, x.priority_step_ms, nextval('{schema}.message_id_seq') AS mid
                      FROM {schema}.queue x
                     WHERE x.name = p_queue
                       AND {schema}._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
                ), k AS (
                    INSERT INTO {schema}.send_key AS k (queue_id, key, at_ms, ids)
                    SELECT q.id, p_send_key, v_now, ARRAY[q.mid] FROM q
                    ON CONFLICT (queue_id, key) DO NOTHING
                    RETURNING k.queue_id
                ), ins AS (
                    INSERT INTO {schema}.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                      priority, kind, content_type, headers, payload)
                    SELECT q.id, q.mid, v_gen,
                           {schema}._dequeue_at(v_at, p_priority, q.priority_step_ms, v_now), v_at, v_now, p_priority,
                           p_kind, p_content_type, p_headers, p_payload
                      FROM q JOIN k ON k.queue_id = q.id
                    RETURNING m.id, m.queue_id
                ), st AS (
                    INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
                    SELECT ins.queue_id, v_now / 60000, 1 FROM ins
                )
                SELECT ins.id, 'created'::text FROM ins;
        END IF;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    SELECT s.id, s.outcome
      FROM {schema}.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],
                               ARRAY[p_headers], ARRAY[p_at_ms], ARRAY[p_delay_ms], ARRAY[p_priority],
                               ARRAY[p_key], ARRAY[p_channel], p_on_conflict, p_now, p_send_key) s;
END $$;

-- Send one plain message: send(p_queue, p_payload, p_content_type, p_kind) with every other
-- argument defaulted (no headers, delay, time, priority, key, channel or send key), returning
-- the new message's id alone (send() returns (id, 'created') for such a message). What
-- Client.send() calls for a plain message, and the pgmq facade's plain send (pgmq.sql). The
-- same rows, locks and order as send()'s plain statement (keep them in step:
-- tests/sql/test_send_plain.py compares them): the queue by its name's unique index, _send_ok
-- (the payload's size and presence, the generation's hold, the wake-up, the generation re-read),
-- the message (scheduled, enqueued and due now, priority 0: _dequeue_at of those is now) and
-- its queue_stat row. Anything it does not write (an unknown queue, a NULL payload, a payload
-- over the queue's limit: errors; a generation that moved while we took it: rare) goes through
-- send_batch, which raises or sends with the same semantics. Why a function of its own: every
-- plpgsql expression and statement builds its state once per transaction, and a producer's
-- send is a transaction of its own, so send()'s argument checks, its p_now branch and its
-- RETURNS TABLE (a RETURN QUERY's tuple store) cost every call several thousand instructions
-- that a plain message does not need (docs/benchmarks.md, a lean plain send). A scalar result,
-- the INSERT's RETURNING ... INTO. Pinned plans as send()'s (enable_seqscan = off).
CREATE OR REPLACE FUNCTION {schema}.send_plain(
    p_queue        text,
    p_payload      bytea,
    p_content_type text DEFAULT NULL,
    p_kind         text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    v_gen bigint := pg_sequence_last_value('{schema}.message_gen_seq');  -- _gen_write()'s first read
    v_id  bigint;
BEGIN
    WITH ins AS (
        INSERT INTO {schema}.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                          kind, content_type, payload)
        SELECT x.id, v_gen, v_now, v_now, v_now, p_kind, p_content_type, p_payload
          FROM {schema}.queue x
         WHERE x.name = p_queue
           AND {schema}._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
        RETURNING m.id, m.queue_id
    ), st AS (
        INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
        SELECT ins.queue_id, v_now / 60000, 1 FROM ins
    )
    SELECT ins.id INTO v_id FROM ins;
    IF NOT FOUND THEN
        SELECT s.id INTO v_id
          FROM {schema}.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type]) s;
    END IF;
    RETURN v_id;
END $$;

-- Send one plain message once per send key: send_plain(p_queue, p_payload, p_content_type,
-- p_kind) with the idempotency key p_send_key, returning the new message's id. What
-- Client.send() calls for a plain message when it gives the call a key (a Client(dsn) with a
-- retry policy does for every send: idempotent_sends). Its statement is send()'s keyed one
-- with send_plain's defaults (keep them in step: tests/sql/test_send_plain_once.py compares
-- them): the queue by its name's unique index, _send_ok (the payload's size and presence, the
-- generation's hold, the wake-up, the generation re-read), the message's id from the sequence
-- first, the key's send_key row holding it (ON CONFLICT DO NOTHING: a key the queue has
-- recorded inserts nothing; a call running with the key holds its index entry, and this insert
-- waits for it to end), the message (due now, priority 0) and its queue_stat row. Anything it
-- does not write (a repeat of the key: the recorded result; an unknown queue, a NULL payload, a
-- payload over the queue's limit: errors; a generation that moved while we took it: rare; a
-- NULL p_send_key: a send without a key) goes through send_batch, which replays, raises or
-- sends with send()'s semantics; a repeat returns the first id the key recorded (the key names
-- the call: its arguments are not compared). Keys are kept lonnymq.send_key_retention
-- (maintain(), maintenance.sql). Why a function of its own rather than send_plain with a fifth
-- argument: send_plain's plain calls stay exactly as they were (no argument more, no branch),
-- no migration drops a function that routers proxy and the pgmq facade calls, and each of the
-- two has one statement with one cached plan (docs/benchmarks.md, a lean keyed send). Pinned
-- plans as send()'s (enable_seqscan = off).
CREATE OR REPLACE FUNCTION {schema}.send_plain_once(
    p_queue        text,
    p_payload      bytea,
    p_send_key     uuid,
    p_content_type text DEFAULT NULL,
    p_kind         text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;  -- now_ms()
    v_gen bigint := pg_sequence_last_value('{schema}.message_gen_seq');  -- _gen_write()'s first read
    v_id  bigint;
BEGIN
    IF p_send_key IS NOT NULL THEN
        WITH q AS (
            SELECT x.id, nextval('{schema}.message_id_seq') AS mid
              FROM {schema}.queue x
             WHERE x.name = p_queue
               AND {schema}._send_ok(x.id, x.name, x.max_payload_bytes, p_payload, v_gen)
        ), k AS (
            INSERT INTO {schema}.send_key AS k (queue_id, key, at_ms, ids)
            SELECT q.id, p_send_key, v_now, ARRAY[q.mid] FROM q
            ON CONFLICT (queue_id, key) DO NOTHING
            RETURNING k.queue_id
        ), ins AS (
            INSERT INTO {schema}.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at,
                                              kind, content_type, payload)
            SELECT q.id, q.mid, v_gen, v_now, v_now, v_now, p_kind, p_content_type, p_payload
              FROM q JOIN k ON k.queue_id = q.id
            RETURNING m.id, m.queue_id
        ), st AS (
            INSERT INTO {schema}.queue_stat (queue_id, minute, sent)
            SELECT ins.queue_id, v_now / 60000, 1 FROM ins
        )
        SELECT ins.id INTO v_id FROM ins;
    END IF;
    IF NOT FOUND THEN
        SELECT s.id INTO v_id
          FROM {schema}.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],
                                   p_send_key => p_send_key) s
         ORDER BY s.ord
         LIMIT 1;
    END IF;
    RETURN v_id;
END $$;
