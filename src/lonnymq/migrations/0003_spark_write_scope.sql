-- LonnyMQ 0003: Spark write ids scoped to their queue and expiring (issue 15). Stored data
-- only; the functions are in ../sql/spark.sql. Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled.

-- A write id (or streaming sink) is remembered per queue: the same id on another queue is
-- another write. Each record expires `retention` after its commit (default 7 days; writers
-- choose it, maintain() prunes), and counts the reruns it turned into no-ops.
ALTER TABLE {schema}.spark_sink_commit
    ADD COLUMN expires_at      bigint,
    ADD COLUMN skipped         bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_skipped_at bigint;
UPDATE {schema}.spark_sink_commit SET expires_at = committed_at + 604800000;
ALTER TABLE {schema}.spark_sink_commit ALTER COLUMN expires_at SET NOT NULL;
ALTER TABLE {schema}.spark_sink_commit DROP CONSTRAINT spark_sink_commit_pkey;
ALTER TABLE {schema}.spark_sink_commit ADD PRIMARY KEY (queue, sink_id, batch_id);
CREATE INDEX spark_sink_commit_expiry_idx ON {schema}.spark_sink_commit (expires_at);

-- Producers may read back what their write ids did (lonnymq.spark.write_status).
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('spark_write_status', 'producer', ARRAY['EXECUTE']);
