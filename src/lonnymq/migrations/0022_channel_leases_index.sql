-- LonnyMQ 0022: the partial index of leases holds channel messages only (docs/benchmarks.md,
-- branch leaseidx). Stored data, and one internal function whose signature changes.
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal; literal
-- braces are doubled.
--
-- Every lease of a plain message inserted an entry there (11.6k of a drain's 148k server
-- instructions per message at batch 100) for three readers, served another way now: take's and
-- take_tx's check after a short batch (take.sql, _undeliverable_ready) reads the generations of
-- the dequeue index, where an expired lease of a plain message already is; queue_metrics counts
-- a plain queue's leases in the future rows of its generations (queues.sql). A channel at its
-- concurrency limit still looks up its earliest lease expiry here (channels.sql, take.sql), and
-- queue_metrics counts the channels' leases here.
-- Dropped first, so that each partition's new index takes the old one's name (the same
-- transaction: no statement runs between the two). Every statement on the message table waits
-- for the build (the DROP's ACCESS EXCLUSIVE lock is held until migrate commits), which reads
-- the whole table: 38 ms for 323k messages (docs/benchmarks.md, branch leaseidx), as 0008's
-- rebuild of the dequeue index did. An index of a partitioned table cannot be built
-- CONCURRENTLY, nor anything in migrate's one transaction; migrate waits at most its
-- lock_timeout for the lock, and tries again.
DROP INDEX {schema}.message_leased_idx;
CREATE INDEX message_channel_leased_idx ON {schema}.message (queue_id, channel, dequeue_at)
    WHERE leased AND channel IS NOT NULL;

-- _undeliverable_ready reads the generations it is given (sql/take.sql defines the new signature).
DROP FUNCTION IF EXISTS {schema}._undeliverable_ready({schema}.queue, bigint);
