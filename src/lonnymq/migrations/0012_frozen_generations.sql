-- LonnyMQ 0012: a queue's backlog stays in the generations it was written in (issue 17,
-- sql/generations.sql, docs/storage.md). Stored data only. Template: {schema} is the quoted
-- schema identifier, {schema_name} its string literal; literal braces are doubled.

-- Per queue, the generations outside the window that hold more of its plain messages than a
-- rotation moves (a backlog, or many scheduled or leased messages), oldest first: its takes
-- read them in that order before the window, and rotate() drops a generation from the list once
-- the queue's rows there have come down to a few and been moved forward. No foreign key: a
-- rotation must never wait for, or fail on, a queue being dropped; rotate() forgets queues that
-- are gone.
CREATE TABLE {schema}.message_gen_frozen (
    queue_id integer PRIMARY KEY,
    gens     bigint[] NOT NULL
);

-- Metrics, peek and next_ready_in read the generations of one queue (_gens_of).
DROP FUNCTION IF EXISTS {schema}._gens_live();

-- rotate() now keeps both generations of the window on record (a crash or failover can move the
-- generation sequence up to 32 ahead): those of an existing database, now.
INSERT INTO {schema}.message_gen_pending (gen)
SELECT g FROM {schema}.message_gen_seq s, LATERAL (VALUES (s.last_value - 1), (s.last_value)) v(g)
ON CONFLICT DO NOTHING;
