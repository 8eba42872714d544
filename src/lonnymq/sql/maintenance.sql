-- LonnyMQ housekeeping, run periodically (worker, cron or the CLI).
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Housekeeping: delete acknowledged archive rows older than each queue's retention, at most
-- p_limit per call, and empty channels nothing keeps; forget settles older than an hour (at
-- most p_limit; settled, ack's memory of its repeats), forget send keys older than the setting
-- lonnymq.send_key_retention (an interval, default 1 hour; at most p_limit; send_key, what
-- makes a retried send safe: docs/messages.md); fold per-minute counters (queue_stat, which
-- holds total_sent too) older than a day, of a round of 500 queues a call, and delete expired
-- workers (_stats_maintain, stats.sql); forget Spark write ids past their retention (spark_prune);
-- rotate the generations when due (rotate, generations.sql). Returns how many
-- archive rows were deleted. Raises LQ002 for a send_key_retention that is not a
-- non-negative interval. Writes archive, channel (SKIP LOCKED:
-- never waits for a channel in use), settled, send_key, queue_stat (the counters it folds).
CREATE OR REPLACE FUNCTION {schema}.maintain(p_limit integer DEFAULT 10000, p_now bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now  bigint := {schema}._now(p_now);
    v_n    bigint;
    v_keep bigint := {schema}._send_key_retention_ms();
BEGIN
    PERFORM {schema}._check_limit(p_limit);
    -- Only the queues that have archive rows, found by a skip scan of the archive's key (one
    -- probe each, and one more), each queue's retention by its key: walking every queue cost
    -- 91 ms at 10,000 queues (issue 19), most of them with no archive at all. The rows go by
    -- ctid (a TID scan, never a join planned from statistics).
    DELETE FROM {schema}.archive a
     WHERE a.ctid = ANY (ARRAY(
           WITH RECURSIVE aq AS (
               (SELECT x.queue_id FROM {schema}.archive x ORDER BY x.queue_id LIMIT 1)
               UNION ALL
               SELECT (SELECT x.queue_id FROM {schema}.archive x WHERE x.queue_id > aq.queue_id
                        ORDER BY x.queue_id LIMIT 1)
                 FROM aq WHERE aq.queue_id IS NOT NULL
           )
           SELECT o.tid
             FROM aq
            CROSS JOIN LATERAL (SELECT q.retention_ms FROM {schema}.queue q
                                 WHERE q.id = aq.queue_id OFFSET 0) q
            CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM {schema}.archive x
                                 WHERE x.queue_id = aq.queue_id AND x.status = 'acked'
                                   AND x.archived_at < v_now - q.retention_ms
                                 LIMIT p_limit) o
            LIMIT p_limit));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    -- Empty channels nothing keeps (not configured, out of their release interval) go too;
    -- SKIP LOCKED: never wait for a channel in use.
    DELETE FROM {schema}.channel c
     USING (SELECT g.queue_id, g.name FROM {schema}.channel g
             WHERE g.current_size = 0 AND NOT g.explicit
               AND coalesce(g.last_served_at + g.release_interval_ms, 0) <= v_now
               AND coalesce(g.blocked_until, 0) <= v_now
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED) e
     WHERE c.queue_id = e.queue_id AND c.name = e.name;
    -- Settles past the hour: read in physical order (no index on the time, migration 0021:
    -- once the table has turned over, a BRIN summary spans old to new in every range), stopping
    -- at p_limit rows.
    DELETE FROM {schema}.settled s
     USING (SELECT o.ctid FROM {schema}.settled o WHERE o.settled_at < v_now - 3600000
             LIMIT p_limit) old
     WHERE s.ctid = old.ctid;
    -- Send keys are kept long enough for any retry of their call (the client's retries stop
    -- after 30 s); by time, through the BRIN index on at_ms.
    DELETE FROM {schema}.send_key k
     USING (SELECT o.ctid FROM {schema}.send_key o WHERE o.at_ms < v_now - v_keep
             LIMIT p_limit) old
     WHERE k.ctid = old.ctid;
    PERFORM {schema}._stats_maintain(p_limit, v_now);
    -- Spark write ids and sink batches past their retention (sql/spark.sql).
    PERFORM {schema}.spark_prune(p_limit, v_now);
    -- Generations (sql/generations.sql), when one is due: take() does it too, maintain() for
    -- queues nobody takes from.
    PERFORM {schema}.rotate(p_now => v_now);
    RETURN v_n;
END $$;

-- How long maintain() keeps send keys, in ms: the setting lonnymq.send_key_retention (an
-- interval: ALTER DATABASE ... SET lonnymq.send_key_retention = '2 hours'), default 1 hour.
-- Raises LQ002 for a value that is not a non-negative interval. Touches no table.
CREATE OR REPLACE FUNCTION {schema}._send_key_retention_ms() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_text text := coalesce(nullif(current_setting('lonnymq.send_key_retention', true), ''), '1 hour');
    v_ms   bigint;
BEGIN
    BEGIN
        v_ms := (extract(epoch FROM v_text::interval) * 1000)::bigint;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
        v_ms := NULL;
    END;
    IF v_ms IS NULL OR v_ms < 0 THEN
        PERFORM {schema}._invalid(format('lonnymq.send_key_retention must be a non-negative interval, got %L',
                                         v_text));
    END IF;
    RETURN v_ms;
END $$;
