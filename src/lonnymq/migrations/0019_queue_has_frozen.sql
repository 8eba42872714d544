-- LonnyMQ 0019: the queue row says whether the queue has frozen generations, and ack's memory
-- keeps a plain B-tree (issue 12, docs/benchmarks.md). Stored data only. Template: {schema} is
-- the quoted schema identifier, {schema_name} its string literal; literal braces are doubled.

-- has_frozen: a row of message_gen_frozen exists for the queue (generations.sql's freeze sets
-- it and the thaw clears it, in the transaction that writes that row). take and take_tx read
-- the queue's row anyway: with the flag, a pop or a batch lease of a queue without a backlog
-- (nearly every call) no longer reads message_gen_frozen (its executor start-up and probe: ~6 %
-- of a pop's server instructions).
ALTER TABLE {schema}.queue ADD COLUMN has_frozen boolean NOT NULL DEFAULT false;
UPDATE {schema}.queue q SET has_frozen = true
 WHERE EXISTS (SELECT FROM {schema}.message_gen_frozen f WHERE f.queue_id = q.id);

-- settled's key becomes a non-unique B-tree on the same columns: every ack inserts a row, and a
-- unique index checks for a duplicate on each insert (a second descent). No duplicate can be
-- written: a row is inserted only by the statement that deletes (or dead-letters) the message
-- (queue_id, id), whose ids are never reused; the readers (ack's repeats, queue_drop, the shard
-- move) look rows up by (queue_id, id[, token]) as before.
-- An ALTER TABLE on a table every ack writes: migrate asks for its lock with a short
-- lock_timeout and tries again later (Client.migrate), as 0018.
CREATE INDEX settled_queue_id_id_idx ON {schema}.settled (queue_id, id);
ALTER TABLE {schema}.settled DROP CONSTRAINT settled_pkey;
