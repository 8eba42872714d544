-- LonnyMQ 0013: idempotent sends (issue 18 item 2), and the producers' and consumers' lean
-- calls send() and pop() (issue 12 items 2 and 3). Stored data only; the functions are in
-- ../sql/ (send.sql, take.sql, maintenance.sql). Template: {schema} is the quoted schema
-- identifier, {schema_name} its string literal; literal braces are doubled.

-- What a send call with a send key (a uuid the client makes for each call, docs/messages.md)
-- did, so that a repeat of the call (a retry after a lost reply) creates nothing and returns
-- the same result: the ids of the call's messages in input order, and their outcomes when not
-- all of them were 'created' (NULL: all created). Written by the transaction that sends, so the
-- key exists exactly when the messages do. Scoped by queue: the same key sent to another queue
-- is another send. Logged (unlike settled): a send that committed before a crash or a failover
-- must still be recognised when its client repeats it afterwards. maintain() forgets keys
-- older than lonnymq.send_key_retention (1 hour); the BRIN index on at_ms keeps that cheap
-- (rows arrive in time order) without a second B-tree on the hot path.
CREATE TABLE {schema}.send_key (
    queue_id integer NOT NULL,
    key      uuid NOT NULL,
    at_ms    bigint NOT NULL,
    ids      bigint[],
    outcomes text[],
    PRIMARY KEY (queue_id, key)
);
CREATE INDEX send_key_at_idx ON {schema}.send_key USING brin (at_ms);

-- send_batch gained p_send_key (after p_now, so that positional calls keep working):
-- CREATE OR REPLACE cannot add a parameter, so the old signature goes; sql/send.sql creates
-- the new one.
DROP FUNCTION IF EXISTS {schema}.send_batch(text, bytea[], text[], text[], jsonb[], bigint[], bigint[],
                                            smallint[], text[], text[], text, bigint);

-- send: one message in one statement (what Client.send() calls); pop: take-and-delete in the
-- caller's transaction (take_tx without archiving, what the pgmq facade's pop calls).
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('send', 'producer', ARRAY['EXECUTE']),
    ('pop',  'consumer', ARRAY['EXECUTE']);
