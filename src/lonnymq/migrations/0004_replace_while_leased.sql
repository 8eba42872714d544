-- LonnyMQ 0004: a replace of a leased message keeps the new version (issue 11 item 1). Stored
-- data only; the functions are in ../sql/ (send.sql, take.sql, settle.sql, messages.sql).
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal; literal
-- braces are doubled.

-- send(..., on_conflict => 'replace') on a message whose lease has not expired leaves that row
-- with its holder and inserts the new version as a new message (a new id: no token handed out
-- before can settle it); the old row points to it here. A superseded row is never delivered
-- again: its ack deletes it, its nack or an expired lease deletes it instead of retrying it.
ALTER TABLE {schema}.message ADD COLUMN superseded_by bigint;

-- The key belongs to the current version only: a superseded row keeps its key (get/cancel by
-- key and sends see the new version) but leaves the unique index. On the partitioned parent
-- (the partitions get theirs); the partition key queue_id is part of it.
DROP INDEX {schema}.message_key_idx;
CREATE UNIQUE INDEX message_key_idx ON {schema}.message (queue_id, key)
    WHERE key IS NOT NULL AND superseded_by IS NULL;

-- A superseded delivery that its holder nacked (the row is deleted, not retried): remembered so
-- that a repeat of that nack reports success, like the other settles.
ALTER TABLE {schema}.settled DROP CONSTRAINT settled_outcome_check;
ALTER TABLE {schema}.settled ADD CONSTRAINT settled_outcome_check
    CHECK (outcome IN ('acked', 'dead', 'superseded'));
