-- LonnyMQ 0010: the numbers behind the web dashboard (issue 16; functions in ../sql/stats.sql,
-- docs/web.md). Stored data only. Template: {schema} is the quoted schema identifier,
-- {schema_name} its string literal; literal braces are doubled.

-- What happened to each queue, minute by minute: messages sent (created by sends, dead letters
-- moved in, requeued dead messages: what sent_count counts), acked, nacked (retried after a
-- failure that counts an attempt), dead (dead-lettered or archived as dead) and cancelled.
-- Batched like sent_count, without a hot row: every call that changes messages appends one row
-- from the statement doing the work, nothing on the hot path updates a row, and readers sum.
-- Worker heartbeats fold the recent minutes (one row per queue and minute); maintain() folds
-- the rest, minutes older than a day into one row per queue (minute 0), so totals stay exact.
CREATE TABLE {schema}.queue_stat (
    queue_id  integer NOT NULL,
    minute    bigint NOT NULL,  -- epoch ms / 60000; 0: the folded past
    sent      bigint NOT NULL DEFAULT 0,
    acked     bigint NOT NULL DEFAULT 0,
    nacked    bigint NOT NULL DEFAULT 0,
    dead      bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0
);
CREATE INDEX queue_stat_minute_idx ON {schema}.queue_stat (queue_id, minute);

-- Running workers, one row each, written by the worker's heartbeat (worker_beat) and deleted
-- on a clean stop (worker_leave); a row whose expires_at passed is stale (the process died):
-- worker_list leaves it out and maintain() deletes it.
CREATE TABLE {schema}.worker (
    id           text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 200),
    host         text NOT NULL CHECK (length(host) <= 255),
    pid          integer NOT NULL,
    queues       text[] NOT NULL,
    concurrency  integer NOT NULL CHECK (concurrency >= 0),
    in_flight    integer NOT NULL CHECK (in_flight >= 0),
    started_at   bigint NOT NULL,
    heartbeat_at bigint NOT NULL,
    expires_at   bigint NOT NULL
);
CREATE INDEX worker_expires_idx ON {schema}.worker (expires_at);

-- A worker logs in as a consumer: it registers itself, and its metrics exporter reads the
-- counters. Listing (stats_minutes, worker_list, message_list) stays with admin, like
-- queue_list and archive_list.
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('worker_beat',  'consumer', ARRAY['EXECUTE']),
    ('worker_leave', 'consumer', ARRAY['EXECUTE']),
    ('stats_totals', 'consumer', ARRAY['EXECUTE']);
