-- LonnyMQ 0021: ack's memory (settled) in a cheaper shape. Stored data only. Template:
-- {schema} is the quoted schema identifier, {schema_name} its string literal; literal braces
-- are doubled.

-- settled's primary key (queue_id, id) becomes a hash index on id: every ack, nack and
-- dead-letter writes a settled row, and the unique B-tree's insert (a descent and a check for a
-- duplicate that cannot exist: message ids come from one sequence and are never reused, and
-- nack and give_up write one row per id) cost more than any other part of that row. The rows
-- are read only by id, on rare paths (a repeated or stale ack, nack or give_up: sql/settle.sql),
-- with the queue as a filter: a hash index finds them in a probe or two whatever the table
-- holds. queue_drop and a shard move delete a queue's rows by queue_id with a scan of the table
-- (an hour of settles at most, as maintain() prunes it; both are rare). The BRIN index on
-- settled_at stays, for that prune. Counted in docs/benchmarks.md ("Ack's memory in a cheaper
-- shape"), with the shapes tried and dropped (a BRIN on (settled_at, id), plain or
-- minmax-multi).
-- An ALTER TABLE and an index build on a table every ack writes: migrate asks for its locks
-- with a short lock_timeout and tries again later rather than wait behind a long transaction
-- that holds the table while every ack waits behind it (Client.migrate). The build holds acks
-- for as long as it reads the table (an hour of settles at most).
CREATE INDEX settled_id_idx ON {schema}.settled USING hash (id);
ALTER TABLE {schema}.settled DROP CONSTRAINT settled_pkey;
