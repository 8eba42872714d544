-- LonnyMQ 0021: ack's memory (settled) in a cheaper shape. Stored data only. Template:
-- {schema} is the quoted schema identifier, {schema_name} its string literal; literal braces
-- are doubled.

-- settled keeps one index: a hash index on id, instead of the primary key (queue_id, id) and
-- the BRIN index on settled_at. Every ack, nack and dead-letter writes a settled row, and those
-- two index entries cost more than the row itself (docs/benchmarks.md, "Ack's memory in a
-- cheaper shape": 28.3k instructions a row in the steady state, 14.3k now).
-- * The key: its unique B-tree checked for a duplicate that cannot exist (message ids come
--   from one sequence and are never reused; nack and give_up write one row per id). The rows
--   are read only by id, on rare paths (a repeated or stale ack, nack or give_up,
--   sql/settle.sql), with the queue as a filter: the hash index finds them in a probe or two,
--   whatever the table holds. queue_drop and a shard move delete a queue's rows by queue_id
--   with a scan of the table (an hour of settles at most; both rare).
-- * The BRIN: maintain() deletes rows older than an hour, vacuum frees their space and new rows
--   fill it, and a BRIN summary only ever widens: once the table has turned over, ranges span
--   old to new times and the prune's bitmap scan read most or all of the table (in the counts
--   there, as many blocks as a sequential scan), while each insert widened a summary. The prune
--   (sql/maintenance.sql) now reads the table in physical order and stops at its limit.
-- An ALTER TABLE and an index build on a table every ack writes: migrate asks for its locks
-- with a short lock_timeout and tries again later rather than wait behind a long transaction
-- that holds the table while every ack waits behind it (Client.migrate). The build then holds
-- acks for as long as it reads the table (an hour of settles at most: 4 s for 1M rows on a
-- loaded 2-core machine).
CREATE INDEX settled_id_idx ON {schema}.settled USING hash (id);
ALTER TABLE {schema}.settled DROP CONSTRAINT settled_pkey;
DROP INDEX {schema}.settled_at_idx;
