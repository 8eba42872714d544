-- LonnyMQ 0002: message-level operations (issue 11): cancel, archive reads, idempotent settle,
-- total_sent. Stored data only; the functions are in ../sql/ (messages.sql, settle.sql,
-- queues.sql, dead.sql). Template: {schema} is the quoted schema identifier, {schema_name} its
-- string literal; literal braces are doubled.

-- A cancelled message may be archived (message_cancel(..., p_archive => true)).
ALTER TABLE {schema}.archive DROP CONSTRAINT archive_status_check;
ALTER TABLE {schema}.archive ADD CONSTRAINT archive_status_check
    CHECK (status IN ('acked', 'dead', 'cancelled'));

-- What a settle did to a message it removed, so that a repeat of it by the same delivery
-- (a retry after a lost reply) reports success instead of LeaseLost, while a stale token (the
-- message was delivered again, updated or cancelled) still gets LeaseLost. One row per message
-- removed by ack (without archive; an archived ack is remembered by its archive row) or
-- dead-lettered by nack/give_up. Messages ids are never reused, so (queue_id, id) is the key.
-- UNLOGGED: it is a cache of recent answers, written on the hot path; a server crash empties
-- it, and a repeat then gets LeaseLost (an error, never a false success). maintain() prunes
-- rows older than an hour; the BRIN index on settled_at keeps that cheap (rows arrive in time
-- order) without a second B-tree to maintain on every ack.
CREATE UNLOGGED TABLE {schema}.settled (
    queue_id   integer NOT NULL,
    id         bigint NOT NULL,
    token      integer NOT NULL,
    outcome    text NOT NULL CHECK (outcome IN ('acked', 'dead')),
    settled_at bigint NOT NULL,
    PRIMARY KEY (queue_id, id)
);
CREATE INDEX settled_at_idx ON {schema}.settled USING brin (settled_at);

-- Messages ever sent to each queue (queue_metrics' total_sent), exact and transactional without
-- a hot row: every send appends a row (queue_id, n) and nothing updates one; maintain() folds
-- each queue's rows into one. A rolled-back send leaves nothing.
CREATE TABLE {schema}.sent_count (
    queue_id integer NOT NULL,
    n        bigint NOT NULL
);
CREATE INDEX sent_count_queue_idx ON {schema}.sent_count (queue_id);
-- Queues that existed before this migration start from what they still hold (live and archived).
INSERT INTO {schema}.sent_count (queue_id, n)
SELECT q.id, (SELECT count(*) FROM {schema}.message m WHERE m.queue_id = q.id)
             + (SELECT count(*) FROM {schema}.archive a WHERE a.queue_id = q.id)
  FROM {schema}.queue q;

-- Signatures that changed (CREATE OR REPLACE cannot change a result type or drop a parameter;
-- the new versions are created by the function files, which run after this).
DROP FUNCTION IF EXISTS {schema}.queue_metrics(text, integer, bigint);
DROP FUNCTION IF EXISTS {schema}.dead_list(text, integer, bigint);

-- Reading one message and cancelling: producers (who scheduled it) and consumers; archive_list
-- reads every archived payload and stays with admin, like dead_list.
INSERT INTO {schema}.security_grant (object, kind, privileges) VALUES
    ('message_get',    'producer', ARRAY['EXECUTE']),
    ('message_get',    'consumer', ARRAY['EXECUTE']),
    ('message_cancel', 'producer', ARRAY['EXECUTE']),
    ('message_cancel', 'consumer', ARRAY['EXECUTE']);
