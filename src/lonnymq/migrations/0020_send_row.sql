-- LonnyMQ 0020: send() returns one value of a composite type, not a set (issue 12; function in
-- ../sql/send.sql). Stored data: the type; and the old function, whose result type changes.
-- Template: {schema} is the quoted schema identifier, {schema_name} its string literal; literal
-- braces are doubled.

-- What send() returns: the message's id and the outcome, as send_batch's rows (without ord).
-- A plain function of this type can be called in a select list (SELECT send(...)): one Result
-- node, where a set-returning function is a Function Scan with its tuple store, set up at every
-- call (docs/benchmarks.md, "send() returns one value"). SELECT * FROM send(...) and SELECT id,
-- outcome FROM send(...) still return the columns id and outcome.
CREATE TYPE {schema}.sent AS (
    id      bigint,
    outcome text
);

-- CREATE OR REPLACE cannot change a function's result type: sql/send.sql creates it again (in
-- the same transaction as this migration, so callers never see it missing).
DROP FUNCTION IF EXISTS {schema}.send(text, bytea, text, text, jsonb, bigint, bigint, smallint, text,
                                      text, text, uuid, bigint);
