-- LonnyMQ 0016: queue_drop at scale (issue 19). Stored data only. Template: {schema} is the
-- quoted schema identifier, {schema_name} its string literal; literal braces are doubled.

-- Dropping a queue asks whether another queue names it as its dead-letter queue, and the
-- foreign key (ON DELETE RESTRICT) asks again when the row goes: both read every queue row
-- without an index (twice per drop at 10,000 queues). Few queues name one, so the index is
-- partial and small; `dead_letter_queue_id = $1` implies the predicate, so both use it.
CREATE INDEX queue_dead_letter_queue_id_idx ON {schema}.queue (dead_letter_queue_id)
    WHERE dead_letter_queue_id IS NOT NULL;
