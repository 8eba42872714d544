-- LonnyMQ 0019: the queue row says whether the queue has frozen generations (issue 12,
-- sql/generations.sql, docs/benchmarks.md). Stored data only. Template: {schema} is the quoted
-- schema identifier, {schema_name} its string literal; literal braces are doubled.

-- has_frozen: a row of message_gen_frozen exists for the queue (generations.sql's freeze sets
-- it and the thaw clears it, in the transaction that writes that row). take and take_tx read
-- the queue's row anyway: with the flag, a pop or a batch lease of a queue without a backlog
-- (nearly every call) no longer reads message_gen_frozen (its executor start-up and probe: 7 %
-- of a pop's server instructions).
ALTER TABLE {schema}.queue ADD COLUMN has_frozen boolean NOT NULL DEFAULT false;
UPDATE {schema}.queue q SET has_frozen = true
 WHERE EXISTS (SELECT FROM {schema}.message_gen_frozen f WHERE f.queue_id = q.id);
