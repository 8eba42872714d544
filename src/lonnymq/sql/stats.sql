-- LonnyMQ statistics and the worker registry: reading the per-queue, per-minute counters
-- (stats_minutes, stats_totals: the web dashboard, the metrics exporter, `lonnymq queue stats`),
-- folding them (_stats_fold), the running workers (worker_beat, worker_leave, worker_list) and
-- the housekeeping of both (_stats_maintain, called by maintain). Tables: queue_stat and worker
-- (migration 0010_dashboard).
--
-- The counters are batched: each call that sends, acks, retries, dead-letters or cancels
-- appends one row (queue, minute, its counts) to queue_stat from the statement that does the
-- work (send.sql, settle.sql, dead.sql, messages.sql), never updating a shared row, so writers
-- never wait for each other; readers sum. Folding merges each (queue, minute)'s rows into one:
-- the recent minutes on a worker heartbeat (worker_beat, at most every 10 s), everything and
-- minutes older than a day into one row per queue (minute 0) on maintain (a round of 500 queues
-- a call). Transactional: a rolled-back call counts nothing, and a fold merges only committed
-- rows.
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- The counters minute by minute: for each queue named in p_queues (NULL: every queue; unknown
-- names are left out) and each minute in [p_since, p_until) that counted anything (epoch ms,
-- default: the hour before p_now), the sums of its rows. minute_at is the minute's start (epoch
-- ms). Minutes without activity have no row. Raises LQ002 for a window longer than 7 days or
-- reversed. Reads queue (the named queues by their name's index: the dashboard's overview asks
-- for one page of them, whatever the number of queues), queue_stat (a range of its (queue_id,
-- minute) index per queue); takes no lock.
CREATE OR REPLACE FUNCTION {schema}.stats_minutes(
    p_queues text[] DEFAULT NULL,
    p_since  bigint DEFAULT NULL,
    p_until  bigint DEFAULT NULL,
    p_now    bigint DEFAULT NULL
) RETURNS TABLE (queue text, minute_at bigint, sent bigint, acked bigint, nacked bigint,
                 dead bigint, cancelled bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now   bigint := {schema}._read_now(p_now);
    v_until bigint := coalesce(p_until, v_now + 1);
    v_since bigint := coalesce(p_since, v_until - 3600000);
    v_ids   integer[] := {schema}._stat_queue_ids(p_queues);
BEGIN
    IF v_since > v_until OR v_until - v_since > 7 * 86400000 THEN
        PERFORM {schema}._invalid('the window must be at most 7 days, since <= until');
    END IF;
    RETURN QUERY
    SELECT q.name, x.minute * 60000, x.sent, x.acked, x.nacked, x.dead, x.cancelled
      FROM {schema}.queue q
     CROSS JOIN LATERAL (
           SELECT s.minute, sum(s.sent)::bigint AS sent, sum(s.acked)::bigint AS acked,
                  sum(s.nacked)::bigint AS nacked, sum(s.dead)::bigint AS dead,
                  sum(s.cancelled)::bigint AS cancelled
             FROM {schema}.queue_stat s
            WHERE s.queue_id = q.id
              AND s.minute >= greatest(v_since / 60000, 1) AND s.minute * 60000 < v_until
            GROUP BY s.minute) x
     WHERE q.id = ANY (v_ids)
     ORDER BY q.name, x.minute;
END $$;

-- Totals since the queue was created (sent: since migration 0002 for older queues, as
-- queue_metrics' total_sent, which is this sum; the others since migration 0010): for each queue
-- named in p_queues (NULL: every queue; unknown names are left out), by name, the sums of all
-- its counter rows, zeros for a queue that never counted anything. Exact and transactional
-- (rows of calls not yet committed are not seen). Reads queue (the named queues by their name's
-- index: the dashboard's queue page asks for one, whatever the number of queues), queue_stat
-- (its (queue_id, minute) index per queue); takes no lock.
CREATE OR REPLACE FUNCTION {schema}.stats_totals(p_queues text[] DEFAULT NULL)
RETURNS TABLE (queue text, sent bigint, acked bigint, nacked bigint, dead bigint, cancelled bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_ids integer[] := {schema}._stat_queue_ids(p_queues);
BEGIN
    RETURN QUERY
    SELECT q.name, x.sent, x.acked, x.nacked, x.dead, x.cancelled
      FROM {schema}.queue q
     CROSS JOIN LATERAL (
           SELECT coalesce(sum(s.sent), 0)::bigint AS sent, coalesce(sum(s.acked), 0)::bigint AS acked,
                  coalesce(sum(s.nacked), 0)::bigint AS nacked, coalesce(sum(s.dead), 0)::bigint AS dead,
                  coalesce(sum(s.cancelled), 0)::bigint AS cancelled
             FROM {schema}.queue_stat s
            WHERE s.queue_id = q.id) x
     WHERE q.id = ANY (v_ids)
     ORDER BY q.name;
END $$;

-- The ids of the queues named in p_queues (NULL: every queue; unknown names are left out), for
-- stats_minutes and stats_totals, in a statement of each kind: "p_queues IS NULL OR q.name =
-- ANY (p_queues)" has no index in a generic plan (PL/pgSQL's after five calls, a SQL
-- function's always), which read every queue (30-60 ms a call at 10,000 queues on the
-- dashboard's settings); "name = ANY" alone is a probe of the name's index a name. Reads queue.
CREATE OR REPLACE FUNCTION {schema}._stat_queue_ids(p_queues text[]) RETURNS integer[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_queues IS NULL THEN
        RETURN ARRAY(SELECT q.id FROM {schema}.queue q);
    END IF;
    RETURN ARRAY(SELECT q.id FROM {schema}.queue q WHERE q.name = ANY (p_queues));
END $$;

-- Register or refresh worker p_id (chosen by the worker, unique per process): its host, pid,
-- queues, concurrency and in-flight handlers as of p_now; it counts as running until p_now +
-- p_ttl_ms (default a minute), so a worker that stops beating expires by itself. Also folds
-- the counters of the last ten minutes (_stats_fold) unless another beat is doing it. Returns
-- nothing. Raises LQ002 for a bad id or TTL. Writes worker (its own row), queue_stat. Locks:
-- a transaction advisory lock while folding (tried, never waited for).
CREATE OR REPLACE FUNCTION {schema}.worker_beat(
    p_id          text,
    p_host        text,
    p_pid         integer,
    p_queues      text[],
    p_concurrency integer,
    p_in_flight   integer,
    p_ttl_ms      bigint DEFAULT 60000,
    p_now         bigint DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := {schema}._now(p_now);
BEGIN
    IF p_id IS NULL OR length(p_id) NOT BETWEEN 1 AND 200 THEN
        PERFORM {schema}._invalid('a worker id must have 1 to 200 characters');
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms <= 0 THEN
        PERFORM {schema}._invalid('ttl_ms must be positive');
    END IF;
    -- One worker at a time folds, and at most every 10 s whatever the number of workers (a fold
    -- visits every queue: 70-180 ms at 10,000 queues, which every beat of every worker paid);
    -- queue_stat_fold_seq holds when the last fold ran (a clock that went back folds again).
    IF pg_try_advisory_xact_lock(hashtext({schema_name}), hashtext('lonnymq stats fold'))
       AND NOT v_now - (SELECT f.last_value FROM {schema}.queue_stat_fold_seq f) BETWEEN 0 AND 9999 THEN
        PERFORM setval('{schema}.queue_stat_fold_seq', v_now);
        PERFORM {schema}._stats_fold(v_now / 60000 - 10, ARRAY(SELECT q.id FROM {schema}.queue q));
    END IF;
    INSERT INTO {schema}.worker AS w (id, host, pid, queues, concurrency, in_flight, started_at,
                                      heartbeat_at, expires_at)
    VALUES (p_id, left(coalesce(p_host, ''), 255), coalesce(p_pid, 0),
            coalesce(p_queues, ARRAY[]::text[]), greatest(coalesce(p_concurrency, 0), 0),
            greatest(coalesce(p_in_flight, 0), 0), v_now, v_now, v_now + p_ttl_ms)
    ON CONFLICT (id) DO UPDATE
       SET host = excluded.host, pid = excluded.pid, queues = excluded.queues,
           concurrency = excluded.concurrency, in_flight = excluded.in_flight,
           heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at;
END $$;

-- Unregister worker p_id (a clean stop). Returns whether it was registered. Writes worker.
CREATE OR REPLACE FUNCTION {schema}.worker_leave(p_id text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM {schema}.worker w WHERE w.id = p_id;
    RETURN FOUND;
END $$;

-- The running workers (registered, not expired at p_now), by host, pid and id. Reads worker;
-- takes no lock.
CREATE OR REPLACE FUNCTION {schema}.worker_list(p_now bigint DEFAULT NULL)
RETURNS TABLE (id text, host text, pid integer, queues text[], concurrency integer,
               in_flight integer, started_at bigint, heartbeat_at bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now bigint := {schema}._read_now(p_now);
BEGIN
    RETURN QUERY
    SELECT w.id, w.host, w.pid, w.queues, w.concurrency, w.in_flight, w.started_at, w.heartbeat_at
      FROM {schema}.worker w
     WHERE w.expires_at > v_now
     ORDER BY w.host, w.pid, w.id;
END $$;

-- Fold the counter rows of each (queue among p_ids, minute >= p_from) that has several into one
-- (their sums). Exact under concurrency: rows of calls not yet committed are not seen (they are
-- folded next time), and a row a concurrent fold deleted first is skipped (each inserts the sums
-- of what it deleted). Returns how many rows it removed. Reads queue_stat (an index range per
-- queue); writes queue_stat. Sequential scans off: a plan made for a few hundred ids (a custom
-- one, or a generic one while the table was small) read the whole counter table instead.
CREATE OR REPLACE FUNCTION {schema}._stats_fold(p_from bigint, p_ids integer[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    v_n bigint;
BEGIN
    WITH d AS (
        DELETE FROM {schema}.queue_stat s
         USING (SELECT q.id AS queue_id, g.minute
                  FROM unnest(p_ids) AS q(id)
                 CROSS JOIN LATERAL (SELECT t.minute FROM {schema}.queue_stat t
                                      WHERE t.queue_id = q.id AND t.minute >= p_from
                                      GROUP BY t.minute HAVING count(*) > 1) g) f
         WHERE s.queue_id = f.queue_id AND s.minute = f.minute
        RETURNING s.queue_id, s.minute, s.sent, s.acked, s.nacked, s.dead, s.cancelled
    ), i AS (
        INSERT INTO {schema}.queue_stat (queue_id, minute, sent, acked, nacked, dead, cancelled)
        SELECT d.queue_id, d.minute, sum(d.sent), sum(d.acked), sum(d.nacked), sum(d.dead),
               sum(d.cancelled)
          FROM d GROUP BY d.queue_id, d.minute
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM d) - (SELECT count(*) FROM i) INTO v_n;
    RETURN v_n;
END $$;

-- Housekeeping for maintain(), for a round of at most 500 queues a call (by id, resumed after the
-- last queue the previous call visited: queue_stat_round_seq; visiting every queue each call
-- took 125-170 ms at 10,000 queues): move each one's counter rows older than a day (at most
-- p_limit per call) to minute 0 (the folded past: totals stay exact) and fold each of its
-- (queue, minute) into one row (_stats_fold); and delete expired workers (queue_drop deletes a
-- dropped queue's counters). So a queue's past is folded within queues / 500 calls. Returns
-- nothing. Reads queue (the round), queue_stat (the round's); writes queue_stat, worker.
-- Sequential scans off, as _stats_fold.
CREATE OR REPLACE FUNCTION {schema}._stats_maintain(p_limit integer, p_now bigint) RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    v_cut   bigint := p_now / 60000 - 1440;
    v_after bigint;
    v_round integer[];
BEGIN
    SELECT s.last_value INTO v_after FROM {schema}.queue_stat_round_seq s;
    v_round := ARRAY(SELECT q.id FROM {schema}.queue q WHERE q.id > v_after ORDER BY q.id LIMIT 500);
    -- The next call resumes after the last queue visited, or from the start once all were seen.
    PERFORM setval('{schema}.queue_stat_round_seq',
                   CASE WHEN cardinality(v_round) = 500 THEN v_round[500] ELSE -2147483648 END);
    WITH old AS (
        SELECT s.ctid AS row_id
          FROM unnest(v_round) AS q(id)
         CROSS JOIN LATERAL (SELECT t.ctid FROM {schema}.queue_stat t
                              WHERE t.queue_id = q.id AND t.minute >= 1 AND t.minute < v_cut
                              LIMIT p_limit) s
         LIMIT p_limit
    ), d AS (
        DELETE FROM {schema}.queue_stat s USING old
         WHERE s.ctid = old.row_id
        RETURNING s.queue_id, s.sent, s.acked, s.nacked, s.dead, s.cancelled
    )
    INSERT INTO {schema}.queue_stat (queue_id, minute, sent, acked, nacked, dead, cancelled)
    SELECT d.queue_id, 0, sum(d.sent), sum(d.acked), sum(d.nacked), sum(d.dead), sum(d.cancelled)
      FROM d GROUP BY d.queue_id;
    PERFORM {schema}._stats_fold(0, v_round);
    DELETE FROM {schema}.worker w WHERE w.expires_at <= p_now;
END $$;
