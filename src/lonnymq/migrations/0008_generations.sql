-- LonnyMQ 0008: generations lead the plain dequeue index (issue 17, sql/generations.sql,
-- docs/storage.md). Stored data only. Template: {schema} is the quoted schema identifier,
-- {schema_name} its string literal; literal braces are doubled.

-- The current generation (its last_value; sequences are read without a row version, so a take
-- looks it up for free whatever snapshot is held), and when it was opened (epoch ms).
CREATE SEQUENCE {schema}.message_gen_seq AS bigint MINVALUE 1 START WITH 1;
SELECT setval('{schema}.message_gen_seq', 1, true);
CREATE SEQUENCE {schema}.message_gen_started_seq AS bigint MINVALUE 0 START WITH 0;

-- Every message gets the current generation: writers set it explicitly (_gen_write()), so no
-- default may hide one that forgot.
ALTER TABLE {schema}.message ADD COLUMN gen bigint NOT NULL DEFAULT 1;
ALTER TABLE {schema}.message ALTER COLUMN gen DROP DEFAULT;

-- Plain messages in delivery order within their generation; a take reads two generations.
DROP INDEX {schema}.message_dequeue_idx;
CREATE INDEX message_dequeue_idx ON {schema}.message (gen, queue_id, dequeue_at, id)
    WHERE channel IS NULL;

-- Generations outside the window that may still hold plain messages (see rotate()).
CREATE TABLE {schema}.message_gen_pending (
    gen bigint PRIMARY KEY
);

-- Consumers keep the generations moving (take() calls rotate when it is due).
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('rotate', 'consumer', ARRAY['EXECUTE']);
