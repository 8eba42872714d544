-- LonnyMQ 0014: Spark throughput (issue 20). Stored data only; the functions are in
-- ../sql/spark.sql. Template: {schema} is the quoted schema identifier, {schema_name} its
-- string literal; literal braces are doubled.

-- spark_write_commit publishes a write set-wise unless one of its staged rows has a key or a
-- channel (those need send_batch's bookkeeping). This index holds exactly those rows, so the
-- question is one probe, and the rows of a plain write (most) cost it nothing.
CREATE INDEX spark_stage_keyed_idx ON {schema}.spark_stage (part)
    WHERE key IS NOT NULL OR channel IS NOT NULL;

-- The packed reads go to whoever may read rows one by one: batch reads to the monitor (as
-- spark_read_messages; admin gets every API function), streaming reads to the consumer (as
-- spark_stream_read).
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('spark_read_packed',        'monitor',  ARRAY['EXECUTE']),
    ('spark_stream_read_packed', 'consumer', ARRAY['EXECUTE']);
