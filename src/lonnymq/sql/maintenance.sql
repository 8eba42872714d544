-- LonnyMQ housekeeping, run periodically (worker, cron or the CLI).
--
-- Repeatable: every function here is CREATE OR REPLACE, and migrate re-applies the whole file
-- when its text changes (src/lonnymq/sql/__init__.py). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled. Time is epoch
-- milliseconds (bigint); functions that depend on the clock take p_now so tests control time.

-- Housekeeping: delete acknowledged archive rows older than each queue's retention, at most
-- p_limit per call, and empty channels nothing keeps; forget settles older than an hour (at
-- most p_limit; settled, ack's memory of its repeats) and fold each queue's sent_count rows
-- into one; fold per-minute counters older than a day and delete expired workers
-- (_stats_maintain, stats.sql); forget Spark write ids past their retention (spark_prune);
-- rotate the generations when due (rotate, generations.sql). Returns how many
-- archive rows were deleted. Writes archive, channel (SKIP LOCKED:
-- never waits for a channel in use), settled, sent_count (the rows it folds, which only
-- another maintain locks).
CREATE OR REPLACE FUNCTION {schema}.maintain(p_limit integer DEFAULT 10000, p_now bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now bigint := {schema}._now(p_now);
    v_n   bigint;
BEGIN
    PERFORM {schema}._check_limit(p_limit);
    WITH old AS (
        SELECT a.queue_id, a.id
          FROM {schema}.queue q
          JOIN LATERAL (SELECT a.queue_id, a.id FROM {schema}.archive a
                         WHERE a.queue_id = q.id AND a.status = 'acked'
                           AND a.archived_at < v_now - q.retention_ms
                         LIMIT p_limit) a ON true
         LIMIT p_limit
    )
    DELETE FROM {schema}.archive a USING old
     WHERE a.queue_id = old.queue_id AND a.id = old.id;
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
    DELETE FROM {schema}.settled s
     USING (SELECT o.ctid FROM {schema}.settled o WHERE o.settled_at < v_now - 3600000
             LIMIT p_limit) old
     WHERE s.ctid = old.ctid;
    -- Exact under concurrency: a row another maintain folded first is skipped once deleted,
    -- and rows of sends not yet committed stay for the next run.
    WITH d AS (
        DELETE FROM {schema}.sent_count c
         WHERE c.queue_id IN (SELECT g.queue_id FROM {schema}.sent_count g
                               GROUP BY g.queue_id HAVING count(*) > 1)
        RETURNING c.queue_id, c.n
    )
    INSERT INTO {schema}.sent_count (queue_id, n)
    SELECT d.queue_id, sum(d.n)::bigint FROM d GROUP BY d.queue_id;
    PERFORM {schema}._stats_maintain(p_limit, v_now);
    -- Spark write ids and sink batches past their retention (sql/spark.sql).
    PERFORM {schema}.spark_prune(p_limit, v_now);
    -- Generations (sql/generations.sql), when one is due: take() does it too, maintain() for
    -- queues nobody takes from.
    PERFORM {schema}.rotate(p_now => v_now);
    RETURN v_n;
END $$;
