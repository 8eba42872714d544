-- LonnyMQ 0011: pausing a queue and a read-only monitoring role (issue 16; functions in
-- ../sql/queues.sql and ../sql/take.sql, docs/dashboard.md, docs/security.md). Stored data
-- only. Template: {schema} is the quoted schema identifier, {schema_name} its string literal;
-- literal braces are doubled.

-- A paused queue accepts sends but hands out nothing: take and take_tx (and so Spark's
-- streaming reads) find nothing ready and next_ready_in says so; settles of messages already
-- leased go on. queue_pause / queue_resume set it; queue_list and queue_metrics show it.
ALTER TABLE {schema}.queue ADD COLUMN paused boolean NOT NULL DEFAULT false;

-- queue_list and queue_metrics gained a paused column: CREATE OR REPLACE cannot change a
-- result type, so the old signatures go; sql/queues.sql creates the new ones.
DROP FUNCTION IF EXISTS {schema}.queue_list(integer, text);
DROP FUNCTION IF EXISTS {schema}.queue_metrics(text, integer, bigint);

-- A fourth role, <prefix>_monitor: every read-only function (listings, counts, metrics, the
-- dashboard's pages and the Prometheus exporter's reads), nothing that changes anything.
ALTER TABLE {schema}.security_role DROP CONSTRAINT security_role_kind_check;
ALTER TABLE {schema}.security_role ADD CONSTRAINT security_role_kind_check
    CHECK (kind IN ('producer', 'consumer', 'admin', 'monitor'));

-- Create it like the baseline made the other three (if this session may), with the prefix they
-- were made with (recorded in security_role), and record its name.
DO $$
DECLARE
    v_admin text;
    v_role  text;
    v_can   boolean;
BEGIN
    SELECT s.rolname INTO v_admin FROM {schema}.security_role s WHERE s.kind = 'admin';
    v_role := left(v_admin, -length('_admin')) || '_monitor';
    INSERT INTO {schema}.security_role (kind, rolname) VALUES ('monitor', v_role);
    IF EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = v_role) THEN
        RETURN;
    END IF;
    SELECT r.rolsuper OR r.rolcreaterole INTO v_can FROM pg_catalog.pg_roles r
     WHERE r.rolname = current_user;
    IF NOT v_can THEN
        RAISE WARNING 'lonnymq: role % does not exist and % may not create roles; create it and run SELECT %.%()',
            v_role, current_user, {schema_name}, '_apply_privileges';
        RETURN;
    END IF;
    BEGIN
        EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- roles are cluster-wide: a concurrent install of another schema made it
    END;
END $$;

-- What the monitor may call: functions that only read. Left out: the consumer's wake-up
-- protocol (wait_*: session locks) and Spark's streaming helpers (useless without
-- spark_stream_next, which leases). now_ms and cron_list are VOLATILE only for the clock.
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('migration',           'monitor', ARRAY['SELECT']),
    ('now_ms',              'monitor', ARRAY['EXECUTE']),
    ('queue_list',          'monitor', ARRAY['EXECUTE']),
    ('queue_metrics',       'monitor', ARRAY['EXECUTE']),
    ('worker_queues',       'monitor', ARRAY['EXECUTE']),
    ('next_ready_in',       'monitor', ARRAY['EXECUTE']),
    ('peek',                'monitor', ARRAY['EXECUTE']),
    ('channel_list',        'monitor', ARRAY['EXECUTE']),
    ('message_get',         'monitor', ARRAY['EXECUTE']),
    ('message_list',        'monitor', ARRAY['EXECUTE']),
    ('archive_list',        'monitor', ARRAY['EXECUTE']),
    ('dead_list',           'monitor', ARRAY['EXECUTE']),
    ('stats_minutes',       'monitor', ARRAY['EXECUTE']),
    ('stats_totals',        'monitor', ARRAY['EXECUTE']),
    ('worker_list',         'monitor', ARRAY['EXECUTE']),
    ('cron_list',           'monitor', ARRAY['EXECUTE']),
    ('spark_queue_check',   'monitor', ARRAY['EXECUTE']),
    ('spark_id_range',      'monitor', ARRAY['EXECUTE']),
    ('spark_read_messages', 'monitor', ARRAY['EXECUTE']),
    ('spark_read_archive',  'monitor', ARRAY['EXECUTE']),
    ('spark_write_status',  'monitor', ARRAY['EXECUTE']);
